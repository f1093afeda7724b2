"""An analysis's result is the caller's to change: `t.op_stats().drop(..., inplace=True)`
once left every later `t.op_stats()` empty, and `t.bottlenecks().clear()` every later
findings list (and the dashboard's clients share these traces)."""

from __future__ import annotations

import pandas as pd
import pytest

# drop(..., inplace=True), as the report of this defect did it, is deprecated in pandas 3
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")

FRAMES = ("breakdown", "idle_reasons", "op_stats", "module_stats", "kernel_stats",
          "engine_utilisation", "efficiency", "roofline", "memory_timeline",
          "memory_at_peak", "critical_path", "step_times")


@pytest.mark.parametrize("method", FRAMES)
def test_a_frame_changed_in_place_leaves_the_next_call_whole(basic_pf, method):
    first = getattr(basic_pf, method)()
    kept = first.copy(deep=True)
    first.drop(first.index, inplace=True)
    first["added"] = 1
    again = getattr(basic_pf, method)()
    pd.testing.assert_frame_equal(again, kept)


def test_findings_cleared_or_edited_leave_the_next_call_whole(basic_pf):
    findings = basic_pf.bottlenecks()
    titles = [f.title for f in findings]
    findings[0].evidence.clear()
    findings[0].title = "changed"
    findings.clear()
    again = basic_pf.bottlenecks()
    assert [f.title for f in again] == titles and again[0].evidence


def test_dicts_of_frames_changed_leave_the_next_call_whole(basic_pf):
    summary = basic_pf.summary()
    summary.clear()
    assert basic_pf.summary()["n_steps"] == 2
    cs = basic_pf.compile_summary()
    cs["totals"].drop(cs["totals"].index, inplace=True)
    assert len(basic_pf.compile_summary()["totals"]) == 1
