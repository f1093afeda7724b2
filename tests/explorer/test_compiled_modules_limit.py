"""Modules compiled apart share one compiled function and its recompile limit
(`programs/compiled_modules.py`, on the modelled clock). Ten of them ran the last two
uncompiled, 2.97x the step time, and were told to fix a graph break and to pad their
shapes, with nothing claimed."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "compiled_modules.py"


def test_modules_past_the_recompile_limit_are_claimed_what_raising_it_saves(
        tmp_path: Path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"plain": [], "raised": ["--limit", "16"]},
                            modelled=True)
    plain, raised = load(paths["plain"]), load(paths["raised"])
    (finding,) = [f for f in plain.bottlenecks() if f.rule_id == "recompilation"]
    advice = finding.recommendation
    assert "which module the compiled call runs" in advice, advice
    assert "recompile_limit = 16" in advice and "fix the graph break" not in advice.lower()
    assert "pad or bucket" not in advice, advice
    assert finding.severity != "low"
    claimed = finding.time_lost_ns / plain.summary()["steps_counted"]  # every one uncompiled
    saved = median_step(plain) - median_step(raised)
    assert saved > 0 and claimed == pytest.approx(saved, rel=0.1), (claimed, saved)
    # raised, every module compiles: nothing ran past the limit, nothing to claim
    assert all(f.time_lost_ns == 0 for f in raised.bottlenecks()
               if f.rule_id == "recompilation")
