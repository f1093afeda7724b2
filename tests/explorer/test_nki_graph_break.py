"""An NKI kernel called through nki.jit in a compiled forward breaks the graph (Dynamo
cannot enter its launch): the graph-break finding names nki.as_torch_op, the fix, where a
trial was quoted Dynamo's "a `lock` context manager" and told to avoid it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import analysed_steps

pytestmark = pytest.mark.slow  # two recordings of a compiled model
PROGRAM = Path(__file__).parent / "programs" / "nki_in_compiled.py"



def test_an_nki_kernel_breaking_the_graph_is_told_to_be_a_custom_op(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"jit": [], "op": ["--as-op"]},
                            modelled=True)
    jit, op = load(paths["jit"]), load(paths["op"])
    (f,) = [f for f in jit.bottlenecks() if f.rule_id == "recompilation"]
    assert f.recommendation.startswith(f"The NKI kernel called at {PROGRAM}:51 breaks the "
                                       "graph")
    assert "nki.as_torch_op(kernel)" in f.recommendation
    assert "Avoid using the unsupported context manager" not in f.recommendation
    # an inference model: one graph a call, not a forward and a backward
    assert "Merged into one graph a call" in f.explanation
    claimed = f.time_lost_ns / len(analysed_steps(jit).steps)
    saved = median_step(jit) - median_step(op)
    assert claimed == pytest.approx(saved, rel=0.15), (claimed, saved)
    assert not [g for g in op.bottlenecks() if g.rule_id == "recompilation"]
