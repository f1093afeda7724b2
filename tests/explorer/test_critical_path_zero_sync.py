"""`Trace.critical_path()` past a sync of no length (the device was done when the host
asked): the walk went back to the sync's end, found the same sync there again and spent
its whole budget on it (4 s a report on examples/serve.py's recording, where a token's
`.tolist()` often waits 0 ns), then called everything before it "unexplained"."""

from __future__ import annotations

import json

import neuron_explorer


def _x(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def test_a_sync_of_no_length_is_host_time_on_the_path(tmp_path):
    """Kernel a [12, 100) us, a sync of 0 us at 200, kernel b [510, 600), a sync to the
    step's end [610, 1000): before the last sync the path is the host's own work."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        _x("user_annotation", "ProfilerStep#0", 0, 1000),
        _x("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=1),
        _x("kernel", "a", 12, 88, 0, 7, correlation=1, device=0, stream=7),
        _x("cuda_runtime", "cudaStreamSynchronize", 200, 0),
        _x("cuda_runtime", "cudaLaunchKernel", 500, 2, correlation=2),
        _x("kernel", "b", 510, 90, 0, 7, correlation=2, device=0, stream=7),
        _x("cuda_runtime", "cudaStreamSynchronize", 610, 390)]}))
    cp = neuron_explorer.load(path).critical_path()
    assert "unexplained" not in set(cp["name"])
    assert cp["dur"].sum() == 1000 * 1000
    by = cp.groupby("category")["dur"].sum().div(1000).to_dict()
    assert by == {"python": 606, "op_dispatch": 4, "sync": 390}
