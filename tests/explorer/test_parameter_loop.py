"""A Python loop over the parameters (clipping by hand, an average of the weights) is named
with what its foreach form saves, against recordings of that form (`small_mlp.py`, six
layers, Adam, modelled clock: the same times every run).

A user's clipping loop, `total += p.grad.norm() ** 2` then `p.grad.mul_(coef)` per
parameter, cost 43% of the step and no finding named it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.rules.finding import step_time

pytestmark = pytest.mark.slow  # four recordings
PROGRAM = Path(__file__).parents[1] / "whatif" / "programs" / "small_mlp.py"
MODEL = ["6", "--optimizer", "adam"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("parameter_loop")
    variants = {name: [*MODEL, f"--{name}"] for name in
                ("clip-loop", "clip", "ema", "ema-foreach")}
    variants |= {"groups-clip-loop": [*MODEL, "--groups", "--clip-loop"],
                 "groups-clip": [*MODEL, "--groups", "--clip"],
                 "noise-loop": [*MODEL, "--grad-noise", "loop"],
                 "noise-foreach": [*MODEL, "--grad-noise", "foreach"]}
    return {name: load(path) for name, path in
            record_variants(folder, PROGRAM, variants, modelled=True).items()}


def _finding(trace):
    return [f for f in trace.bottlenecks() if f.rule_id == "parameter_loop"]


def _per_step(trace) -> float:
    return step_time(trace) / len(trace.steps)


def test_clipping_by_hand_saves_what_clip_grad_norm_saves(runs) -> None:
    (f,) = _finding(runs["clip-loop"])
    assert f.title.startswith("A Python loop over 12 parameters launches 48 ops a step")
    assert f.recommendation.startswith("Clip with torch.nn.utils.clip_grad_norm_")
    saved = _per_step(runs["clip-loop"]) - _per_step(runs["clip"])
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
    assert not _finding(runs["clip"])  # clip_grad_norm_'s own ops are one per list


def test_an_average_of_the_weights_saves_what_its_foreach_form_saves(runs) -> None:
    (f,) = _finding(runs["ema"])
    assert "torch._foreach_mul_" in f.recommendation
    assert "torch._foreach_add_" in f.recommendation
    # the average runs after the optimizer's step: in the steps after the first
    saved = _per_step(runs["ema"]) - _per_step(runs["ema-foreach"])
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)
    assert not _finding(runs["ema-foreach"])


def test_a_loop_over_two_parameter_groups_is_found(runs) -> None:
    """Weight decay on the matrices only: the optimizer lists each group apart, in an order
    that is not the model's (the loop was missed: it matched one group's list)."""
    (f,) = _finding(runs["groups-clip-loop"])
    assert f.title.startswith("A Python loop over 12 parameters launches 48 ops a step")
    saved = _per_step(runs["groups-clip-loop"]) - _per_step(runs["groups-clip"])
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)


def test_ops_without_a_foreach_form_stay_in_the_replay(runs) -> None:
    """Noise drawn per gradient: `randn_like` has no foreach form, so the foreach fix keeps
    a draw per parameter; the claim counted it as one launch (0.67 of it was saved)."""
    (f,) = _finding(runs["noise-loop"])
    assert "no foreach form" in f.recommendation
    saved = _per_step(runs["noise-loop"]) - _per_step(runs["noise-foreach"])
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
