"""A compiled decoder's sampling (argmax and an end-of-text check) run eagerly on its
graph's logits: the kernel sequence finding's fix brings it into the compiled function,
where it joins the graph's program. The replay once kept a launch of the sequence and
the ops between its kernels that launch nothing (the view of the last position, an out=
op's allocation): a trial's compiled decoder was claimed 124 us a step where its fix
saved 168. Modelled clock: the same times every run."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow  # two recordings of compiled programs
PROGRAM = Path(__file__).parent / "programs" / "compiled_sampling.py"


def test_sampling_brought_into_the_graph_saves_its_launches_and_views(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"eager": [], "inside": ["--sample-inside"]},
                            modelled=True)
    eager, inside = load(paths["eager"]), load(paths["inside"])
    (f,) = [f for f in eager.bottlenecks() if f.rule_id == "short_kernel_sequence"]
    assert "argmax" in f.title or "argmax" in f.explanation, f.title
    steps = in_analysed_steps(eager, eager.steps)
    # the two runs' analysed steps differ in number (the fix compiles once more): per step
    saved = float(steps["dur"].median() - in_analysed_steps(inside, inside.steps)["dur"].median())
    claimed = f.time_lost_ns / len(steps)
    assert claimed == pytest.approx(saved, rel=0.03), (claimed, saved)
    assert not [g for g in inside.bottlenecks() if g.rule_id == "short_kernel_sequence"]
