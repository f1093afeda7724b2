"""PyTorch-profiler traces as older and other profilers write them: legacy category names,
runtime calls logged on a device process, epoch times with nanosecond fractions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import neuron_explorer
import pytest


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float,
       **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    return {**event, "args": args} if args else event


def test_legacy_categories_without_schema_version(tmp_path: Path) -> None:
    events = [
        _x("Operator", "ProfilerStep#1", 1, 1, 0, 100),
        _x("Operator", "aten::mm", 1, 1, 10, 20),
        _x("Runtime", "cudaLaunchKernel", 1, 1, 12, 5, correlation=7),
        _x("Kernel", "gemm", 0, 7, 40, 30, correlation=7, device=0, stream=7),
        _x("Memcpy", "Memcpy HtoD", 0, 7, 75, 5, device=0),
        _x("Memset", "Memset", 0, 7, 85, 2, device=0),
    ]
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps({"traceEvents": events}))  # no schemaVersion
    t = neuron_explorer.load(path)
    assert t.source_format == "kineto_json"
    assert t.table("slices")["kind"].tolist() == ["step", "op", "runtime", "kernel", "memcpy",
                                              "memset"]
    assert t.ops["name"].tolist() == ["aten::mm"] and len(t.steps) == 1
    kernels = t.kernels.set_index("name")
    assert kernels.loc["gemm", "op_id"] == t.ops["op_id"].iloc[0]  # linked through the call
    assert set(kernels["device"]) == {0}


def test_runtime_calls_on_a_device_process_are_not_kernels(tmp_path: Path) -> None:
    events = [
        {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "MTIA 0"}},
        _x("user_annotation", "ProfilerStep#1", 1, 1, 0, 100),
        _x("cpu_op", "aten::add", 1, 1, 5, 10),
        _x("mtia_ccp_events", "add_kernel", 9, 3, 20, 30),
        _x("mtia_runtime", "mtiaLaunchKernel", 9, 4, 15, 2),
    ]
    path = tmp_path / "mtia.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    t = neuron_explorer.load(path)
    assert t.kernels["name"].tolist() == ["add_kernel"]
    kinds = dict(zip(t.table("slices")["name"], t.table("slices")["kind"], strict=True))
    assert kinds["mtiaLaunchKernel"] == "runtime"


def test_epoch_times_keep_their_nanoseconds(tmp_path: Path) -> None:
    # µs since the epoch: a float64 holds them to 0.25 µs, the file to the ns
    text = ('{"schemaVersion": 1, "traceEvents": ['
            '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
            '"ts": 1682725898236567.047, "dur": 1.5},'
            '{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, '
            '"ts": 1682725898236569.999, "dur": 0.001},'
            '{"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, '
            '"ts": 1682725898236571, "dur": 2}]}')
    path = tmp_path / "epoch.json"
    path.write_text(text)
    s = neuron_explorer.load(path).table("slices")
    assert s["ts"].tolist() == [1682725898236567047, 1682725898236569999, 1682725898236571000]
    assert s["dur"].tolist() == [1500, 1, 2000]


def _epoch_trace(path: Path, extra_args: str = "", ts_b: str = "1682725898236569.999") -> Path:
    path.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
        f'"ts": 1682725898236567.047, "dur": 1.5, "args": {{{extra_args}}}}},'
        '{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "ts": 0.0, '
        '"args": {"name": "main"}},'
        '{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, '
        f'"ts": {ts_b}, "dur": 0.001}},'
        '{"ph": "s", "cat": "ac2g", "name": "f", "id": 7, "pid": 1, "tid": 1, '
        '"ts": 1682725898236567.048},'
        '{"ph": "f", "cat": "ac2g", "name": "f", "id": 7, "pid": 1, "tid": 1, '
        f'"ts": {ts_b}, "bp": "e"}}]}}')
    return path


@pytest.mark.parametrize("extra_args, ts_b", [
    ("", "1682725898236569.999"),
    # a nested "ts" the text's fields would count as an event's: the digits are read by
    # parsing again, not from misaligned fields
    ('"ts": 1682725898236000.001, "n": 1', "1682725898236569.999"),
    # a time with an exponent is no field the text scan reads: parsed again too
    ("", "1.682725898236569999e15"),
    # a negative epoch time (a clock before its zero) keeps its digits
    ("", "-1682725898236569.999"),
])
def test_epoch_times_keep_their_digits_however_they_are_written(
        tmp_path: Path, extra_args: str, ts_b: str) -> None:
    t = neuron_explorer.load(_epoch_trace(tmp_path / "epoch.json", extra_args, ts_b),
                             cache=False)
    s = t.slices.set_index("name")
    b = -1682725898236569999 if ts_b.startswith("-") else 1682725898236569999
    assert s.loc["a", "ts"] == 1682725898236567047
    assert s.loc["b", "ts"] == b
    assert s.loc["b", "dur"] == 1
    if extra_args:  # the nested value is the float the args keep
        assert s.loc["a", "args"]["ts"] == 1682725898236000.001
    # the flow binds by exact times: its start into a, its end onto b
    assert t.flows[["src_id", "dst_id"]].values.tolist() == [[s.loc["a", "id"], s.loc["b", "id"]]]
