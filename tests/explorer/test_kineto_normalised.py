"""PyTorch-profiler (Kineto) traces are mapped onto our kinds and args at the loader, and
nothing past the loaders asks where a trace came from.

The figures pinned on the real traces are those the explorer computed before the mapping
moved into the loader (when tables, analyses and rules still branched on the format).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import neuron_explorer
import pytest
from neuron_explorer.analyses.idle import idle_summary
from neuron_explorer.common import trace_format as tf

ROOT = Path(__file__).resolve().parents[2]


def _findings(trace: neuron_explorer.Trace) -> dict[str, tuple[float, str]]:
    return {f.rule_id: (f.time_lost_ns, f.title) for f in trace.bottlenecks()}


def _idle(trace: neuron_explorer.Trace) -> dict[str, tuple[int, int]]:
    frame = idle_summary(trace)
    return {r.reason: (int(r.ns), int(r.gaps)) for r in frame.itertuples() if r.gaps}


def test_gpu_trace_figures(load_real: Any) -> None:
    """A sampled GPU training trace (kernels, copies, NCCL): links, idle and findings."""
    t = load_real("trace_filter__sampled_rank-0.json.gz")
    s = t.summary()
    assert (s["n_steps"], s["steps_analysed"], s["n_ops"], s["n_kernels"]) == (2, [551, 552],
                                                                               514, 1154)
    assert s["step_time_ns"] == 615_120_000
    assert s["device_busy_share"] == pytest.approx(0.44516191962543894)
    k, ops = t.kernels, t.ops
    assert (int((k["op_slice_id"] >= 0).sum()), len(k)) == (1188, 1204)  # through the calls
    assert (int((ops["kernel_id"] >= 0).sum()), int(ops["device_dur"].sum())) == (510,
                                                                                 607_225_000)
    assert int(k["bytes"].sum()) == 222_097_863
    # 9 gaps end in a kernel launched early in the gap that then waited far longer on
    # another stream (one 56 ms): up to the launch's return the device waited on the host,
    # after it on the dependency (73.7 ms that were counted as host_launch before)
    assert _idle(t) == {"host_launch": (289_257_000, 270), "dependency": (385_934_000, 669)}
    found = _findings(t)
    # The device also waits 386 ms on other streams, but the host waits for the device
    # only 20.7 ms in these steps (ops that wait for their own kernels): the host sets
    # their length, and those waits cost no more than that (low findings).
    assert set(found) == {"host_bound", "exposed_communication", "queued_idle",
                          "launch_delay"}
    assert found["host_bound"][0] == 289_257_000
    assert found["exposed_communication"][0] == 336_983_000
    assert found["queued_idle"][0] == 20_706_000


@pytest.mark.slow
def test_custom_accelerator_trace_figures(load_real: Any) -> None:
    """Meta's MTIA (a non-CUDA device, like a PrivateUse1 backend): its copies are device
    events, and cpu_ops that launched nothing are the host's, not host-device copies."""
    t = load_real("mtia_trace_single_rank__mtia_rank_0.json.gz")
    s = t.summary()
    assert (s["n_ops"], s["n_kernels"], s["devices"]) == (5167, 3453, [9])
    assert s["device_busy_share"] == pytest.approx(0.5775036572778579)
    assert int((t.kernels["op_slice_id"] >= 0).sum()) == 3453
    assert _idle(t) == {"host_launch": (397_804_240, 1314), "dependency": (5_232_572_013, 20953)}
    found = _findings(t)
    assert found["host_device_copies"] == (279_755_312,
                                           "Host<->device copies in 1 of 1 steps (22359 copies)")
    # the copies take 425 ms, of which 280 ms set the step's length (the critical path):
    # the rest overlaps work that takes as long without them
    (copies,) = [f for f in t.bottlenecks() if f.rule_id == "host_device_copies"]
    assert copies.symptom_ns == 425_399_760
    assert copies.saving_basis.startswith("critical path")
    # the device waits 5.23 s with work launched; the step's critical path runs through
    # 3.61 s of them, and no more than that is saved
    assert found["dependency_idle"][0] == 3_610_711_344


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float,
       **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def test_kineto_args_gain_ours(tmp_path: Path) -> None:
    """The loader adds our args beside Kineto's, as `loaders/kineto.py` declares."""
    events = [
        _x("user_annotation", "ProfilerStep#3", 1, 1, 0, 100),
        _x("cpu_op", "aten::linear", 1, 1, 10, 40, **{"External id": 42,
                                                       "Input Dims": [[8, 16], [4, 16]],
                                                       "Input type": ["float", "float"]}),
        _x("cpu_op", "aten::mm", 1, 1, 11, 30, **{"External id": 43}),  # nested: no op row
        _x("cuda_runtime", "cudaLaunchKernel", 1, 1, 12, 5, correlation=7),
        _x("cpu_op", "aten::relu", 1, 1, 60, 10),  # no External id: its slice id
        _x("kernel", "gemm", 0, 7, 40, 30, correlation=7, device=0, stream=7),
    ]
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    t = neuron_explorer.load(path)
    s = t.table("slices").set_index("name")
    args = t.slice_args
    linear, relu = int(s.loc["aten::linear", "id"]), int(s.loc["aten::relu", "id"])
    assert args.get(linear)[tf.ARG_OP_ID] == 42 and args.get(linear)["External id"] == 42
    assert args.get(linear)[tf.ARG_SHAPES] == [[8, 16], [4, 16]]
    assert args.get(relu) == {tf.ARG_OP_ID: relu}
    assert args.get(int(s.loc["gemm", "id"]))[tf.ARG_KERNEL_ID] == 7
    assert args.get(int(s.loc["cudaLaunchKernel", "id"]))[tf.ARG_KERNEL_ID] == 7
    assert t.metadata[tf.META_HOST_OPS] is True
    assert t.ops["name"].tolist() == ["aten::linear", "aten::relu"]
    kernel = t.kernels.iloc[0]
    assert (kernel["op_id"], kernel["op_slice_id"], kernel["step"]) == (42, linear, 3)
    assert t.ops.set_index("name").loc["aten::linear", "kernel_id"] == 7


def test_our_traces_have_device_ops_only() -> None:
    t = neuron_explorer.load(ROOT / "sample_traces" / "mlp_eager.pftrace")
    assert tf.META_HOST_OPS not in t.metadata


# `source_format` compared, tested for membership or used in a condition
_BRANCH = re.compile(r"source_format\W*\s*(==|!=|\bin\b|\bnot\b)|(==|!=|\bin\b)\s*[\w.]*"
                     r"source_format|\b(if|elif|while|and|or)\b[^\n#]*source_format")


_STRING = re.compile(r"\"[^\"]*\"|'[^']*'")  # a key named "source_format" is no branch


def branches_on_source_format(text: str) -> list[str]:
    """Lines of Python source that branch on `source_format`."""
    return [line.strip() for line in text.splitlines()
            if _BRANCH.search(_STRING.sub("''", line).split("#")[0])]


def test_the_checker_sees_a_branch() -> None:
    assert branches_on_source_format('    if trace.source_format == "kineto_json":\n')
    assert branches_on_source_format('    if len(ops) and trace.source_format != "x":\n')
    assert branches_on_source_format('x = a if t.source_format in FORMATS else b\n')
    assert not branches_on_source_format('    "source_format": trace.source_format,\n')
    assert not branches_on_source_format('if "source_format" not in manifest:\n')


def test_nothing_past_the_loaders_branches_on_the_format() -> None:
    """Formats are normalised in explorer/loaders/: analyses, rules, tables and pages read
    every trace alike (reading `source_format` to show it is fine)."""
    found = {}
    for folder in ("explorer", "webapp"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if (ROOT / "explorer" / "loaders") in path.parents:
                continue
            hits = branches_on_source_format(path.read_text())
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}
