"""The critical path's walk (`critical_path._walk`), compiled with numba for large traces.

The Python walk costs a few microseconds per segment: 25 s of a 10 M-event trace's
report. This walk takes the same steps over the same sorted arrays in machine code and
returns each segment as (ts, dur, what, ref): `what` says which of the Python walk's
segments it is, `ref` the sync, kernel or host category it names; `segments` turns them
into the Python walk's tuples. `tests/explorer/test_critical_path.py` checks that both
walks give the same paths.

Compiled code is cached on disk by numba (`cache=True`): the first use on a machine pays
the compilation (seconds), later processes load it.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

# what a segment is (its `ref`): the host's own work (category code), a sync's wait and
# its latency (sync), a kernel, a collective and its wait for the last rank, a launch, a
# dependency on its queue or on another queue (the kernel it explains), the budget's end
HOST_WORK, SYNC, SYNC_LATENCY, KERNEL, COLLECTIVE, COLLECTIVE_WAIT, LAUNCH, QUEUE, \
    DEPENDENCY, UNEXPLAINED = range(10)

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)


@_jit
def _bisect_right(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@_jit
def _bisect_left(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def _last_by(ends: np.ndarray, kernels: np.ndarray, lo: int, hi: int, t: int,
             exclude: int) -> int:
    """`_EndOrder.last_by` over ends[lo:hi] (sorted by end, then kernel)."""
    i = _bisect_right(ends, lo, hi, t) - 1
    while i >= lo:
        first = _bisect_left(ends, lo, i + 1, ends[i])
        for j in range(first, i + 1):
            if kernels[j] != exclude:
                return kernels[j]
        i = first - 1
    return -1


@_jit
def _walk(lo: int, hi: int, budget: int, sync_start: np.ndarray, sync_end: np.ndarray,
          sync_ends_sorted: np.ndarray, sync_by_end: np.ndarray, run_start: np.ndarray,
          run_category: np.ndarray, ts: np.ndarray, end: np.ndarray, wait: np.ndarray,
          collective: np.ndarray, launch: np.ndarray, launch_end: np.ndarray,
          queue_of: np.ndarray, all_end: np.ndarray, all_kernel: np.ndarray,
          queue_ptr: np.ndarray, queue_end: np.ndarray, queue_kernel: np.ndarray,
          out_ts: np.ndarray, out_dur: np.ndarray, out_what: np.ndarray,
          out_ref: np.ndarray) -> int:
    """The segments from `hi` back to `lo`, latest first, into the out arrays; their
    count, or -1 when the arrays are too short (the caller grows them and walks again)."""
    cap = len(out_ts)
    n = 0
    t, on_host, kernel = hi, True, -1
    n_dev, n_runs = len(ts), len(run_start)
    for _ in range(budget):
        if t <= lo:
            break
        if on_host:
            j = _bisect_right(sync_ends_sorted, 0, len(sync_ends_sorted), t) - 1
            i = sync_by_end[j] if j >= 0 and sync_ends_sorted[j] > lo else -1
            start = max(sync_end[i] if i >= 0 else lo, lo)
            if t > start:  # the host's own work in [start, t), by category, latest first
                first = _bisect_right(run_start, 0, n_runs, start) - 1
                last = _bisect_left(run_start, 0, n_runs, t) - 1
                for r in range(last, first - 1, -1):
                    if n >= cap:
                        return -1
                    x0 = max(run_start[r], start)
                    x1 = min(run_start[r + 1], t) if r + 1 < n_runs else t
                    out_ts[n], out_dur[n], out_what[n], out_ref[n] = \
                        x0, x1 - x0, HOST_WORK, run_category[r]
                    n += 1
            t = start
            if i < 0 or t <= lo:
                break
            kernel = _last_by(all_end, all_kernel, 0, n_dev, t, -1)
            if kernel < 0 or end[kernel] <= max(lo, sync_start[i]):
                s0 = max(sync_start[i], lo)
                if n >= cap:
                    return -1
                out_ts[n], out_dur[n], out_what[n], out_ref[n] = s0, t - s0, SYNC, i
                n += 1
                t = s0
                continue
            if end[kernel] < t:
                if n >= cap:
                    return -1
                out_ts[n], out_dur[n], out_what[n], out_ref[n] = \
                    end[kernel], t - end[kernel], SYNC_LATENCY, i
                n += 1
                t = end[kernel]
            on_host = False
            continue
        if n + 2 > cap:
            return -1
        k0 = max(ts[kernel], lo)
        if collective[kernel]:
            last_rank = min(max(k0, ts[kernel] + max(wait[kernel], 0)), t)
            out_ts[n], out_dur[n], out_what[n], out_ref[n] = \
                last_rank, t - last_rank, COLLECTIVE, kernel
            out_ts[n + 1], out_dur[n + 1], out_what[n + 1], out_ref[n + 1] = \
                k0, last_rank - k0, COLLECTIVE_WAIT, kernel
            n += 2
        else:
            out_ts[n], out_dur[n], out_what[n], out_ref[n] = k0, t - k0, KERNEL, kernel
            n += 1
        t = k0
        if t <= lo:
            break
        q = queue_of[kernel]
        prev = _last_by(queue_end, queue_kernel, queue_ptr[q], queue_ptr[q + 1], t, kernel)
        other = _last_by(all_end, all_kernel, 0, n_dev, t, kernel)
        # the latest cause; at equal times a queue or dependency before the launch, and
        # the queue before another queue (the Python walk's max over its list)
        when, why, before = launch[kernel], LAUNCH, -1
        if prev >= 0 and end[prev] >= when:
            when, why, before = end[prev], QUEUE, prev
        if other >= 0 and other != prev and other != kernel and (
                end[other] > when or (end[other] == when and why == LAUNCH)):
            when, why, before = end[other], DEPENDENCY, other
        when = min(max(when, lo), t)
        if n >= cap:
            return -1
        if why == LAUNCH:
            when = min(max(launch_end[kernel], when), t)
            out_ts[n], out_dur[n], out_what[n], out_ref[n] = when, t - when, LAUNCH, kernel
            n += 1
            t, on_host = when, True
            continue
        if when < t:
            out_ts[n], out_dur[n], out_what[n], out_ref[n] = when, t - when, why, kernel
            n += 1
            t = when
        kernel = before
    if t > lo:
        if n >= cap:
            return -1
        out_ts[n], out_dur[n], out_what[n], out_ref[n] = lo, t - lo, UNEXPLAINED, -1
        n += 1
    return n


def walk(lo: int, hi: int, budget: int, host: Any, dev: Any) -> tuple[np.ndarray, ...]:
    """The walk from `hi` back to `lo` over the Python walk's `_HostTimeline` and
    `_DeviceQueues` (their `compiled` arrays): (ts, dur, what, ref) per segment, latest
    first."""
    cap = 4096
    while True:
        out = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
               np.empty(cap, np.int64))
        n = _walk(lo, hi, budget, *host.compiled, *dev.compiled, *out)
        if n >= 0:
            return tuple(a[:n] for a in out)
        cap *= 4
