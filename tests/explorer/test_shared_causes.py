"""Findings caused on one line say so: a NaN guard in a compiled forward
(`if torch.isnan(x).any()`) is a graph break and a sync at once, two findings whose
savings were listed side by side (2.78 and 2.75 ms on a trial's CNN, 2.89 saved by
removing the guard) as if they added."""

from __future__ import annotations

from pathlib import Path

from cli_runner import record_variants
from neuron_explorer import load

PROGRAM = Path(__file__).parents[1] / "whatif" / "programs" / "guarded_cnn.py"


def test_a_graph_break_and_a_sync_on_one_line_overlap(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"guarded": []}, modelled=True)
    findings = {f.rule_id: f for f in load(paths["guarded"]).bottlenecks()}
    sync, graph_break = findings["sync_in_step"], findings["recompilation"]
    line = "guarded_cnn.py:26 is also the"
    assert line in sync.explanation and "the recompilation finding's" in sync.explanation
    assert line in graph_break.explanation and "sync_in_step finding's" in graph_break.explanation
    assert "overlap rather than add" in sync.explanation
    # a finding whose evidence is where a cost shows, not its cause, is not paired
    assert "is also the" not in findings["small_dma"].explanation
