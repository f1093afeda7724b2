"""PyTorch-profiler traces as older versions and other vendors write them."""

from __future__ import annotations

import json
from pathlib import Path

import neuron_explorer


def _old_style(tmp_path: Path) -> Path:
    """A trace of an older profiler: capitalised categories, no schemaVersion."""
    events = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0,
         "dur": 100},
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1,
         "dur": 10, "args": {"External id": 5}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2,
         "dur": 3, "args": {"correlation": 9, "external id": 5}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7,
         "ts": 20, "dur": 30, "args": {"correlation": 9, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
         "tid": 7, "ts": 60, "dur": 5, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 70,
         "dur": 2, "args": {"device": 0, "stream": 7}},
    ]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_older_category_names_give_ops_and_kernels(tmp_path):
    trace = neuron_explorer.load(_old_style(tmp_path))
    assert trace.source_format == "kineto_json"
    assert list(trace.ops["name"]) == ["aten::mm"]
    kinds = dict(zip(trace.kernels["name"], trace.kernels["kind"], strict=True))
    assert kinds == {"volta_sgemm_128x64_nn": "kernel",
                     "Memcpy HtoD (Pageable -> Device)": "memcpy", "Memset (Device)": "memset"}
    assert list(trace.steps["step"]) == [3]
    k = trace.kernels.set_index("name")
    assert k.loc["volta_sgemm_128x64_nn", "op_slice_id"] >= 0  # linked through correlation


def test_runtime_events_on_a_device_process_are_not_kernels(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "MTIA 9"}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "fused_kernel", "pid": 9, "tid": 4,
         "ts": 10, "dur": 20, "args": {"device": 9}},
        {"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunchKernel", "pid": 9, "tid": 4,
         "ts": 5, "dur": 2, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0,
         "dur": 8, "args": {}},
    ]
    path = tmp_path / "mtia.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    trace = neuron_explorer.load(path)
    assert list(trace.kernels["name"]) == ["fused_kernel"]
