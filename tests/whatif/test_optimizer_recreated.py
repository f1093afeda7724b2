"""What the finding on an optimizer constructed in every step says constructing it once
saves, against a recording of that fix (modelled clock: both the same every run). A
user's loop that built Adam in each step lost 31% of its steps to the state made anew;
no finding said so, and the one that advised fused=True made it slower."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


def test_an_optimizer_built_every_step_saves_what_building_it_once_saves(tmp_path) -> None:
    base = ["3", "--width", "256", "--optimizer", "adam"]
    paths = record_variants(tmp_path, PROGRAM, {"per_step": [*base, "--optimizer-per-step"],
                                                "once": base}, modelled=True)
    per_step, once = load(paths["per_step"]), load(paths["once"])
    (f,) = [f for f in per_step.bottlenecks() if f.rule_id == "optimizer_recreated"]
    assert f.title == "Adam's state is created again every step"
    assert "fills 12 new state buffers" in f.explanation  # 2 moments of 3 weights, 3 biases
    assert f.recommendation.startswith("Construct Adam once, before the training loop")
    steps = in_analysed_steps(per_step, per_step.steps)
    saved = float(steps["dur"].sum() - in_analysed_steps(once, once.steps)["dur"].sum())
    assert saved > 0.05 * steps["dur"].sum()  # the premise
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
    assert not [f for f in once.bottlenecks() if f.rule_id == "optimizer_recreated"]
    # host_bound's optimizer advice waits on it: fused=True on an optimizer built every
    # step made a user's steps slower where the replay of the recorded ones promised 300 us
    (host,) = [f for f in per_step.bottlenecks() if f.rule_id == "host_bound"]
    assert "the optimizer's step" in host.recommendation
    assert "constructed anew every step (the optimizer_recreated finding)" in host.recommendation
    assert "replayed so, each step takes" not in host.recommendation
