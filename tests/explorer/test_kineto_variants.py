"""PyTorch-profiler traces as older versions and other vendors write them."""

from __future__ import annotations

import json
from pathlib import Path

import neuron_explorer
import pytest


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


def test_idle_waiting_on_launched_work_is_explained(tmp_path):
    """One 1 ms step: a kernel [0, 100) us, then one launched at 10 us that only starts at
    500 us (it waits on another stream): 400 us of dependency idle, 40% of the step."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 1, "dur": 2, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 10, "dur": 2, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "first", "pid": 0, "tid": 7, "ts": 0, "dur": 100,
         "args": {"correlation": 1, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "waits", "pid": 0, "tid": 9, "ts": 500,
         "dur": 400, "args": {"correlation": 2, "device": 0, "stream": 9}},
    ]
    path = tmp_path / "dep.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    found = {f.rule_id: f for f in neuron_explorer.load(path).bottlenecks()}
    dep = found["dependency_idle"]
    assert dep.time_lost_ns == 400_000
    assert dep.share_of_step == 0.4
    assert "another stream" in dep.explanation


def test_a_real_gpu_trace_with_nccl_gets_communication_and_dependency_findings(real_traces_dir):
    trace = neuron_explorer.load(real_traces_dir / "trace_filter__sampled_rank-0.json.gz")
    found = {f.rule_id: f for f in trace.bottlenecks()}
    exposed = found["exposed_communication"]
    comm = trace.communication().iloc[0]
    assert exposed.time_lost_ns == comm["exposed_ns"]
    assert comm["overlap_pct"] == pytest.approx(14.95, abs=0.01)
    assert "all_to_all" in exposed.explanation
    assert "dependency_idle" in found


def test_two_gpus_each_half_busy_are_half_idle(tmp_path):
    """One 1000 us step; GPU 0 runs [0, 500) us, GPU 1 runs [500, 1000) us."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 100, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 0, "dur": 500,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "b", "pid": 1, "tid": 7, "ts": 500, "dur": 500,
         "args": {"device": 1, "stream": 7}},
    ]
    path = tmp_path / "two_gpus.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    bd = neuron_explorer.load(path).breakdown()
    device = bd[bd["side"] == "device"].set_index("category")["ns"]
    assert device["idle"] == 500_000
    assert device.sum() == 1_000_000
