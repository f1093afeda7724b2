"""What the finding on an optimizer run without fused=True says fusing saves, against a
recording of that fix (modelled clock: both the same every run). A user's compiled
transformer spent 28% of its step in AdamW's foreach passes; no finding said so, and
fused=True saved 317 us a step."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


def _median_step(trace) -> float:
    return float(in_analysed_steps(trace, trace.steps)["dur"].median())


def test_an_unfused_adam_saves_what_fused_true_saves(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {
        "foreach": ["4", "--optimizer", "adam"], "fused": ["4", "--optimizer", "adam-fused"],
        "compiled": ["3", "--compile", "--optimizer", "adam"]}, modelled=True)
    foreach, fused = load(paths["foreach"]), load(paths["fused"])
    (f,) = [f for f in foreach.bottlenecks() if f.rule_id == "unfused_optimizer"]
    assert f.title == "Adam's step runs unfused: 7 passes a step"
    assert f.recommendation.startswith("Construct the optimizer with fused=True")
    assert f.evidence and all("Adam.step" in e["description"] for e in f.evidence)
    saved = _median_step(foreach) - _median_step(fused)
    claimed = f.time_lost_ns / len(in_analysed_steps(foreach, foreach.steps))
    assert saved > 0.05 * _median_step(foreach)  # the premise
    assert claimed == pytest.approx(saved, rel=0.1), (claimed, saved)
    assert not [g for g in fused.bottlenecks() if g.rule_id == "unfused_optimizer"]
    # a compiled model's host-bound finding leads with the optimizer's fix and counts its
    # saving: not claimed twice
    compiled = load(paths["compiled"])
    (host,) = [g for g in compiled.bottlenecks() if g.rule_id == "host_bound"]
    assert "construct the optimizer with fused=True" in host.recommendation
    assert not [g for g in compiled.bottlenecks() if g.rule_id == "unfused_optimizer"]
