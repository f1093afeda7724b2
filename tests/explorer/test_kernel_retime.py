"""Re-timing a recording's kernels with host slices removed (`what_if.kernel_retime`): the
counterfactual of traces the backend replay cannot lower again."""

from __future__ import annotations

import json
from pathlib import Path

import neuron_explorer
import numpy as np
import scenarios
from neuron_explorer.what_if.kernel_retime import retime


def _ends(trace: neuron_explorer.Trace, removed: list[int]) -> dict[str, int]:
    """Each kernel's new end by name (-1: removed)."""
    r = retime(trace, np.array(removed, np.int64))
    assert r is not None
    return dict(zip(trace.kernels["name"], r.end.tolist(), strict=True))


def _trace(tmp_path: Path) -> tuple[neuron_explorer.Trace, dict[str, int]]:
    """One 10 us step: op a [0, 1) launches kernel a [1, 5); op b [1, 2) launches kernel b,
    queued behind a [5, 6); op c [2, 2.1) launches kernel c on a second queue, which the
    recording shows starting at 8 (a wait on something else, 5.9 us after its launch);
    the host then waits for the device [2.1, 6), and op d [6, 6.5) launches kernel d
    [6.5, 7)."""
    sc = scenarios.Scenario()
    sc.step(0)
    sc.op(0, 1000, "aten::a", 1, 0, kernel=(1000, 4000))
    sc.op(1000, 1000, "aten::b", 2, 0, kernel=(5000, 1000))
    other = sc.b.device_track(0, "Queue 2")
    sc.b.slice(sc.host, 2000, 100, "aten::c", "op", {"op_id": 3, "kernel_id": 90, "step": 0,
                                                     "device": 0}, flow_out=[3])
    sc.b.slice(other, 8000, 500, "k_c", "kernel", {"kernel_id": 90, "op_id": 3, "step": 0},
               flow_in=[3])
    sc.b.slice(sc.host, 2100, 3900, "sync", "sync", {"kind": "item", "device": 0, "step": 0})
    sc.op(6000, 500, "aten::d", 4, 0, kernel=(6500, 500))
    trace = neuron_explorer.load(sc.write(tmp_path, "retime"))
    ops = trace.ops.set_index("name")["id"].to_dict()
    ops["sync"] = int(trace.slices.loc[trace.slices["kind"] == "sync", "id"].iloc[0])
    return trace, ops


def test_nothing_removed_gives_the_recording_back(tmp_path: Path, basic_pf) -> None:
    for trace in (_trace(tmp_path)[0], basic_pf):
        r = retime(trace, np.zeros(0, np.int64))
        k = trace.kernels
        assert r is not None and np.array_equal(r.end, (k["ts"] + k["dur"]).to_numpy())
        assert not len(r.shift_at)


def test_a_removed_op_takes_its_host_time_and_kernel_with_it(tmp_path: Path) -> None:
    trace, ops = _trace(tmp_path)
    ends = _ends(trace, [ops["aten::a"]])
    # b, launched 1 us earlier at 1, runs at once; the sync waits for it alone, until 2,
    # and the host reaches d 4 us sooner than recorded (1 us of a, 3 us less of waiting)
    assert ends["k_a"] == -1 and ends["k_b"] == 2000
    assert ends["k_d"] == 6500 - 4000 + 500
    # c waited 5.9 us on something the trace does not show: it still does, after its
    # launch (now at 1.1)
    assert ends["k_c"] == 1100 + 5900 + 500


def test_a_removed_sync_lets_the_host_run_ahead(tmp_path: Path) -> None:
    trace, ops = _trace(tmp_path)
    ends = _ends(trace, [ops["sync"]])
    # d is launched 3.9 us earlier, at 2.6, but its queue is busy with b until 6
    assert ends["k_d"] == 6000 + 500
    r = retime(trace, np.array([ops["sync"]]))
    assert r is not None and r.host_time(np.array([10_000]))[0] == 10_000 - 3900


def test_a_trace_whose_kernels_name_no_launch_is_not_retimed(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0,
               "dur": 5, "args": {"device": 0, "stream": 7}}]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert retime(neuron_explorer.load(path), np.zeros(0, np.int64)) is None
