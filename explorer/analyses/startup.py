"""One-time start-up costs: the device idle before a kernel's first launch while the
host initialises (CUDA context, cuDNN/cuBLAS handles, a `cudaFree`/`cudaMalloc` storm,
our device's first lowering), which a longer run pays once and no fix per step removes.

A host-launch gap (the device waiting for the host to launch) is start-up when the
kernel after it is launched for the first time in the trace and the gap is at least
`STARTUP_FACTOR` times the trace's median host-launch gap and `STARTUP_MIN_NS` long.
Only where the analysed time holds the run's start: a trace without steps, or one whose
analysed steps include its first step as the run's first (numbered 0 or 1: an MI250
trace's only full step, ProfilerStep#1, held a 6.6 ms first launch of AccumulateGrad's
add, read as the host launching slowly every step). Otherwise the warm-up steps are left
out of the analysed ones already, and a trace that starts mid-run (ProfilerStep#551) has
no first calls. Findings leave these gaps out; the report lists them once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

STARTUP_FACTOR = 20
STARTUP_MIN_NS = 1_000_000
# The highest number a run's first step carries (ProfilerStep#0 or #1; ours from 0).
FIRST_STEP_NUMBER = 1
COLUMNS = ["ts", "dur", "kernel", "op", "next_slice_id"]


def startup_gaps(trace: Trace) -> pd.DataFrame:
    """The host-launch gaps that are start-up: ts, dur, the kernel launched after it, the
    op that launched it (or ""), and the kernel's slice id."""
    gaps = trace.idle_reasons()
    host = gaps[gaps["reason"] == "host_launch"]
    if not len(host) or not analyses_the_start(trace):
        return pd.DataFrame(columns=COLUMNS)
    s = trace.table("slices")
    names = s["name"].to_numpy()
    k = trace.kernels
    first_ids = set(k.sort_values("ts").drop_duplicates("name")["id"].tolist()) \
        if len(k) else set()
    floor = max(float(host["dur"].median()) * STARTUP_FACTOR, STARTUP_MIN_NS)
    first = np.fromiter((i in first_ids for i in host["next_slice_id"].tolist()), bool,
                        len(host))
    picked = host[first & (host["dur"].to_numpy() >= floor)]
    op_of = dict(zip(k["id"].tolist(), k["op_slice_id"].tolist(), strict=True)) if len(k) \
        else {}
    ops = [op_of.get(i, -1) for i in picked["next_slice_id"].tolist()]
    return pd.DataFrame({
        "ts": picked["ts"].to_numpy(np.int64), "dur": picked["dur"].to_numpy(np.int64),
        "kernel": names[picked["next_slice_id"].to_numpy(np.int64)],
        "op": [str(names[o]) if o >= 0 else "" for o in ops],
        "next_slice_id": picked["next_slice_id"].to_numpy(np.int64)}, columns=COLUMNS)


def analyses_the_start(trace: Trace) -> bool:
    """Whether the analysed time holds the run's first calls: the whole of a trace without
    steps, or analysed steps that include the trace's first step, numbered as a run's
    first (PyTorch's profiler counts from 0 or 1, as do our recordings)."""
    from neuron_explorer.analyses.steady_state import analysed_steps

    if not len(trace.steps):
        return True
    first = int(trace.steps["step"].min())
    return first <= FIRST_STEP_NUMBER and first in analysed_steps(trace).steps


def before_first_kernel(trace: Trace) -> int:
    """In a trace without steps, how long the trace runs before the device's first work
    (a CUDA context and the first copies, for instance): 0 with steps or no kernels."""
    k = trace.kernels
    s = trace.table("slices")
    if len(trace.steps) or not len(k) or not len(s):
        return 0
    return int(k["ts"].min() - s["ts"].min())
