"""Each kernel's launch: how long the host spent in the launch call, how long the kernel
ran, and how long it waited after the call returned before it started (HTA's
`get_cuda_kernel_launch_stats`).

A launch is a runtime call that launched a kernel, copy or memset (`cudaLaunchKernel`,
`cudaLaunchKernelExC`, `cuLaunchKernel`, `cudaMemcpyAsync`, `cudaMemsetAsync` and their
HIP names) in a PyTorch-profiler trace, and the op in our recordings. A short kernel
costs the host more to launch than it runs (`cpu_ns` at most the runtime cutoff and
above `gpu_ns`); a long launch delay is a kernel that waited in its queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["id", "name", "stream", "kernel_id", "launch", "cpu_ns", "gpu_ns", "launch_delay_ns"]
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync",
    "cudaMemsetAsync", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel",
    "hipMemcpyAsync", "hipMemsetAsync"})
# HTA's default cutoffs, in ns
RUNTIME_CUTOFF_NS = 50_000
LAUNCH_DELAY_CUTOFF_NS = 100_000


def launch_stats(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """One row per launched kernel, copy or memset: id (the kernel's slice), name, stream,
    kernel_id (the correlation id), launch (the launching call's or op's slice), cpu_ns
    (its duration), gpu_ns (the kernel's), launch_delay_ns (from the call's return to the
    kernel's start, 0 when it started before). `hta_window`: without the launches of the
    last step of a trace of two or more, which HTA drops."""
    from neuron_explorer.device_terms import device_terms
    from neuron_explorer.tables import kernel_launches

    k = trace.kernels
    if not len(k):
        return pd.DataFrame(columns=COLUMNS)
    s = trace.table("slices")
    launch = kernel_launches(trace)
    if not device_terms(trace.metadata).recorded_here:  # the launch calls only, as HTA
        # the launches' names only (a categorical's codes taken), not a string per slice
        names = s["name"].iloc[np.maximum(launch, 0)]
        launch = np.where(names.isin(LAUNCH_CALLS).to_numpy(), launch, -1)
    keep = launch >= 0
    call_ts = s["ts"].to_numpy(np.int64)[np.maximum(launch, 0)]
    if hta_window and len(trace.steps) >= 2:
        keep &= call_ts < int(trace.steps["ts"].max())
    launch, call_ts, k = launch[keep], call_ts[keep], k[keep]
    cpu = s["dur"].to_numpy(np.int64)[launch]
    start = k["ts"].to_numpy(np.int64)
    track = s["track_id"].to_numpy()[k["id"].to_numpy(np.int64)]
    streams = trace.tracks.set_index("track_id")["name"].astype(str).str.strip()
    return pd.DataFrame({
        "id": k["id"].to_numpy(), "name": k["name"].to_numpy(),
        "stream": streams.reindex(track).to_numpy(), "kernel_id": k["kernel_id"].to_numpy(),
        "launch": launch, "cpu_ns": cpu, "gpu_ns": k["dur"].to_numpy(np.int64),
        "launch_delay_ns": np.maximum(start - (call_ts + cpu), 0)}, columns=COLUMNS)


def launch_outliers(
    stats: pd.DataFrame, runtime_cutoff_ns: int = RUNTIME_CUTOFF_NS,
    launch_delay_cutoff_ns: int = LAUNCH_DELAY_CUTOFF_NS,
) -> dict[str, pd.DataFrame]:
    """HTA's three groups of `launch_stats` rows: `short` (a launch call of at most the
    runtime cutoff, longer than its kernel), `slow_launch` (a launch call over the
    cutoff), `delayed` (a launch delay over its cutoff)."""
    cpu, gpu = stats["cpu_ns"], stats["gpu_ns"]
    return {"short": stats[(cpu <= runtime_cutoff_ns) & (gpu < cpu)],
            "slow_launch": stats[cpu > runtime_cutoff_ns],
            "delayed": stats[stats["launch_delay_ns"] > launch_delay_cutoff_ns]}


OP_KERNEL_COLUMNS = ["op", "kernel_sequence", "count", "op_launch_delay_ns", "runtime_delay_ns"]


def op_kernels(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per ATen op and the kernels it launched (HTA's `get_aten_op_kernels_and_delay`):
    each launched kernel (not a copy or memset) belongs to the innermost `aten::` op
    around its launch on the launching thread (in our recordings the op is the launch);
    the kernels of one op call, in launch order, are its `kernel_sequence` (names joined
    by ` -> `). One row per op name and sequence: count (the op calls), and the means of
    `op_launch_delay_ns` (from the op's start to its first launch call's) and
    `runtime_delay_ns` (from that call's start to its kernel's), most frequent first."""
    stats = launch_stats(trace, hta_window)
    kernels = trace.kernels.set_index("id")
    stats = stats[(kernels["kind"].reindex(stats["id"]) == "kernel").to_numpy()]
    if not len(stats):
        return pd.DataFrame(columns=OP_KERNEL_COLUMNS)
    from neuron_explorer.tables import map_unique

    s = trace.table("slices")
    parent = s["parent_id"].to_numpy(np.int64)
    # per distinct name, not a string per slice
    is_aten = (s["kind"] == "op").to_numpy(bool) & map_unique(
        s["name"], lambda name: isinstance(name, str) and name.startswith("aten::"), bool)
    ts = s["ts"].to_numpy(np.int64)
    ops = []
    for launch in stats["launch"].to_numpy(np.int64):
        node = int(launch)
        while node >= 0 and not is_aten[node]:
            node = int(parent[node])
        ops.append(node)
    frame = stats.assign(op_id=ops, call_ts=ts[stats["launch"].to_numpy(np.int64)],
                         kernel_ts=kernels["ts"].reindex(stats["id"]).to_numpy(np.int64))
    frame = frame[frame["op_id"] >= 0].sort_values(["op_id", "call_ts"], kind="stable")
    if not len(frame):
        return pd.DataFrame(columns=OP_KERNEL_COLUMNS)
    calls = frame.groupby("op_id", sort=False).agg(
        kernel_sequence=("name", lambda names: " -> ".join(map(str, names))),
        call_ts=("call_ts", "first"), kernel_ts=("kernel_ts", "first")).reset_index()
    op_ids = calls["op_id"].to_numpy(np.int64)
    calls["op"] = s["name"].astype(str).to_numpy()[op_ids]
    calls["op_launch_delay_ns"] = calls["call_ts"] - ts[op_ids]
    calls["runtime_delay_ns"] = calls["kernel_ts"] - calls["call_ts"]
    table = calls.groupby(["op", "kernel_sequence"], sort=True).agg(
        count=("op_id", "size"), op_launch_delay_ns=("op_launch_delay_ns", "mean"),
        runtime_delay_ns=("runtime_delay_ns", "mean")).reset_index()
    return table.sort_values("count", ascending=False, kind="stable",
                             ignore_index=True)[OP_KERNEL_COLUMNS]
