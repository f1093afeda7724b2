"""`diff` on PyTorch-profiler traces: nested ops, kernels, and devices of other ranks."""

from __future__ import annotations

import json
from pathlib import Path

import neuron_explorer


def _trace(path: Path, *, gpu: int, ops: list[tuple[str, float, float]],
           kernels: list[tuple[str, float, float]]) -> Path:
    """One step [0, 1000) us with the given cpu ops (name, ts, dur: nesting by time) and
    kernels (name, ts, dur) on GPU `gpu`."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 100,
               "tid": 1, "ts": 0, "dur": 1000}]
    events += [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 100, "tid": 1, "ts": t, "dur": d,
                "args": {"External id": i + 1}} for i, (n, t, d) in enumerate(ops)]
    events += [{"ph": "X", "cat": "kernel", "name": n, "pid": gpu, "tid": 7, "ts": t, "dur": d,
                "args": {"device": gpu, "stream": 7}} for n, t, d in kernels]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_nested_ops_and_kernels_are_compared(tmp_path):
    # A: addmm outermost, t nested in linear. B: addmm now nested in linear, t gone.
    a = _trace(tmp_path / "a.json", gpu=0,
               ops=[("aten::addmm", 10, 20), ("aten::linear", 40, 30), ("aten::t", 45, 5)],
               kernels=[("gemm", 100, 50), ("gemm", 200, 50), ("relu", 300, 10)])
    b = _trace(tmp_path / "b.json", gpu=1,
               ops=[("aten::linear", 10, 30), ("aten::addmm", 15, 20)],
               kernels=[("gemm", 100, 80), ("gemm", 200, 80), ("softmax", 300, 10)])
    d = neuron_explorer.diff(a, b)
    status = dict(zip(d.ops["name"], d.ops["status"], strict=True))
    assert status["aten::addmm"] == "nested"  # still runs, inside aten::linear
    assert status["aten::t"] == "removed"  # only ever nested, and gone
    assert "aten::addmm" not in d.removed_ops and "aten::t" in d.removed_ops
    k = d.kernels.set_index("name")
    assert k.loc["gemm", "status"] == "changed"
    assert k.loc["gemm", "delta_ns"] == 2 * 30_000
    assert k.loc["relu", "status"] == "removed" and k.loc["softmax", "status"] == "added"
    assert "Kernels that changed most" in d.to_text()
    # GPU 0 of rank 0 and GPU 1 of rank 1 are the same device of the setup
    assert set(d.engines["device"]) == {0}
    assert d.engines["status"].eq("common").all()
