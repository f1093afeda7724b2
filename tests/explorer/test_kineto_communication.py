"""Rules and breakdowns on PyTorch-profiler traces: communication, cross-stream waits, and
several GPUs in one file."""

from __future__ import annotations

import json

import neuron_explorer
import pytest


def test_idle_waiting_on_launched_work_is_explained(tmp_path):
    """One 1 ms step: a kernel [0, 100) us, then one launched at 10 us that only starts at
    500 us (it waits on another stream): 400 us of dependency idle, 40% of the step. The
    host waits for the device until 900 us, so the wait is on the step's critical path."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 1, "dur": 2, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 10, "dur": 2, "args": {"correlation": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
         "tid": 1, "ts": 20, "dur": 880},
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
    assert dep.symptom_ns == 400_000 and dep.saving_basis.startswith("critical path")


def test_a_wait_the_host_never_waits_out_costs_nothing(tmp_path):
    """The same device wait in a step whose host never waits for the device: the host sets
    the step's length, and the step is as long without the wait."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 10, "dur": 2, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "waits", "pid": 0, "tid": 9, "ts": 500,
         "dur": 400, "args": {"correlation": 2, "device": 0, "stream": 9}},
    ]
    path = tmp_path / "dep.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    found = {f.rule_id for f in neuron_explorer.load(path).bottlenecks()}
    assert "dependency_idle" not in found


def test_a_real_gpu_trace_with_nccl_gets_communication_and_dependency_findings(real_traces_dir):
    trace = neuron_explorer.load(real_traces_dir / "trace_filter__sampled_rank-0.json.gz")
    found = {f.rule_id: f for f in trace.bottlenecks()}
    exposed = found["exposed_communication"]
    comm = trace.communication().iloc[0]
    assert exposed.time_lost_ns == comm["exposed_ns"]
    assert comm["overlap_pct"] == pytest.approx(14.95, abs=0.01)
    assert "all_to_all" in exposed.explanation
    # its 312 ms of cross-stream waits are hidden: the host never waits for the device
    assert "dependency_idle" not in found
    # its optimizers (Shampoo, an EMA wrapper) have no fused=True, and at 45% of the host's
    # op time they are not "most" of its launches
    advice = found["host_bound"].recommendation
    assert advice.startswith("The largest part of the host's launches is the optimizer's step")
    assert "compile its step (EMAOptimizer, Shampoo have no fused=True)" in advice
    assert "fused=True (one kernel" not in advice


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
