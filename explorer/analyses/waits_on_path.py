"""Which of a device's waits held its host up, matched by time rather than by step.

A device that waits (at a collective, for a late rank) delays every kernel queued after
the wait, until it next runs out of work: idle time, where it waited for the host to
launch more, absorbs the delay. So does a kernel launched late: one that started only
so long after its launch (its slack) would, had the device been free earlier, have
waited for its launch instead, and carries at most that slack of the delay on (a host
launching an optimizer's kernels behind a late all-reduce hid most of its wait: 248 us
of it was counted on a compiled DDP rank's path, where balancing the ranks saved 43).
The host pays what is left only when it then waits for the device (a sync, or an op
blocking on its own kernel), and at most that wait's length; after the sync host and
device start level again. The sync that pays may lie
in the next step (a loss read after `optimizer.step()` waits out the last step's
all-reduce), so waits and syncs are matched in time, not per step.

`host_syncs`, `idle_after` and `slack_after` read one rank's trace (a rank's digest keeps their
results); `delays_at_syncs` replays the matching once each wait is known, which for a
PyTorch-profiler trace is only after the ranks' arrivals are compared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.common.intervals import Union

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

SYNC_COLUMNS = ["ts", "dur", "step"]


def host_syncs(trace: Trace) -> pd.DataFrame:
    """The host's waits on the device, overlapping ones merged: `ts`, `dur` and the
    analysed step the wait starts in (`step`, -1 outside them)."""
    from neuron_explorer.analyses.critical_path import blocking_op_waits
    from neuron_explorer.analyses.step_breakdown import host_slices, step_windows

    host = host_slices(trace)
    marked = host[tables.kind_mask(trace, ("sync",))[host.index.to_numpy()]] \
        if len(host) else host
    op_ts, op_dur = blocking_op_waits(trace)
    starts = np.concatenate([marked["ts"].to_numpy(np.int64), op_ts])
    ends = np.concatenate([starts[:len(marked)] + marked["dur"].to_numpy(np.int64),
                           op_ts + op_dur])
    merged = Union(starts, ends)
    ts, end = merged.starts, merged.ends
    step = tables.assign_steps(ts, step_windows(trace)) if len(trace.steps) \
        else np.full(len(ts), -1, np.int64)
    return pd.DataFrame({"ts": ts, "dur": end - ts, "step": step}, columns=SYNC_COLUMNS)


def idle_after(trace: Trace, coll: pd.DataFrame, syncs: pd.DataFrame) -> np.ndarray:
    """Per row of `coll` (collective calls with `device`, `ts`, `dur`): the time its device
    stood idle between the call's end and the first of the next call's start on that
    device and the end of the next host sync that ends after the call (the sync that
    would pay a delay the call passed on)."""
    out = np.zeros(len(coll), np.int64)
    if not len(coll):
        return out
    k = trace.kernels
    sync_end = np.sort((syncs["ts"] + syncs["dur"]).to_numpy(np.int64))
    device_of = coll["device"].to_numpy()
    coll_ts = coll["ts"].to_numpy(np.int64)
    coll_end = coll_ts + coll["dur"].to_numpy(np.int64)
    never = np.iinfo(np.int64).max
    for device in pd.unique(device_of):
        on = k[k["device"] == device]
        rows = np.flatnonzero(device_of == device)
        rows = rows[np.argsort(coll_ts[rows], kind="stable")]
        start, end = coll_ts[rows], coll_end[rows]
        k_ts = on["ts"].to_numpy(np.int64)
        busy = Union(np.concatenate([k_ts, start]),
                     np.concatenate([k_ts + on["dur"].to_numpy(np.int64), end]))
        next_start = np.append(start[1:], never)
        # the first sync that ends after the call (none: no sync will pay)
        next_sync = np.append(sync_end, never)[np.searchsorted(sync_end, end, side="left")]
        # past the device's last work nothing more is queued: no idle to count there
        until = np.maximum(np.minimum(np.minimum(next_start, next_sync),
                                      int(busy.ends.max())), end)
        out[rows] = np.maximum((until - end) - busy.covered(end, until), 0)
    return out


def slack_after(trace: Trace, coll: pd.DataFrame, syncs: pd.DataFrame) -> np.ndarray:
    """Per row of `coll`: the most delay the kernels after the call carry on to the sync
    that would pay it: the least slack (start less launch) of the kernels on its device
    that start after the call's end and before the next call's start and the end of the
    next host sync (NO_CAP where none has a known launch)."""
    from neuron_explorer.analyses.idle import launch_ends

    out = np.full(len(coll), NO_CAP, np.int64)
    k = trace.kernels
    if not len(coll) or not len(k):
        return out
    launched = launch_ends(trace, k)
    known = launched >= 0
    k_ts = k["ts"].to_numpy(np.int64)
    slack = np.maximum(k_ts - launched, 0)
    k_device = k["device"].to_numpy()
    sync_end = np.sort((syncs["ts"] + syncs["dur"]).to_numpy(np.int64))
    device_of = coll["device"].to_numpy()
    coll_ts = coll["ts"].to_numpy(np.int64)
    coll_end = coll_ts + coll["dur"].to_numpy(np.int64)
    for device in pd.unique(device_of):
        mine = np.flatnonzero((k_device == device) & known)
        mine = mine[np.argsort(k_ts[mine], kind="stable")]
        starts = k_ts[mine]
        rows = np.flatnonzero(device_of == device)
        rows = rows[np.argsort(coll_ts[rows], kind="stable")]
        next_start = np.append(coll_ts[rows][1:], NO_CAP)
        for r, end, nxt in zip(rows.tolist(), coll_end[rows].tolist(), next_start.tolist(),
                               strict=True):
            paying = sync_end[np.searchsorted(sync_end, end, side="left"):]
            until = min(nxt, int(paying[0]) if len(paying) else NO_CAP)
            after = mine[np.searchsorted(starts, end, side="left"):
                         np.searchsorted(starts, until, side="left")]
            if len(after):
                out[r] = int(slack[after].min())
    return out


NO_CAP = np.iinfo(np.int64).max


def delays_at_syncs(coll: pd.DataFrame, syncs: pd.DataFrame) -> np.ndarray:
    """Per row of `syncs`: how much shorter that host wait would be without the waits of
    `coll` (`ts`, `dur`, `wait_ns`, `idle_after_ns`, and `slack_after_ns` where known),
    each wait carried forward on its device until idle time or kernels launched late
    absorb it or a sync pays it."""
    paid = np.zeros(len(syncs), np.int64)
    if not len(coll) or not len(syncs):
        return paid
    end = (coll["ts"] + coll["dur"]).to_numpy(np.int64)
    order = np.argsort(end, kind="stable")
    end = end[order]
    wait = np.maximum(coll["wait_ns"].to_numpy(np.int64)[order], 0)
    idle = coll["idle_after_ns"].to_numpy(np.int64)[order]
    cap = (coll["slack_after_ns"].to_numpy(np.int64)[order] if "slack_after_ns" in coll
           else np.full(len(order), NO_CAP, np.int64))
    sync_end = (syncs["ts"] + syncs["dur"]).to_numpy(np.int64)
    sync_dur = syncs["dur"].to_numpy(np.int64)
    delay, i = 0, 0
    for j in np.argsort(sync_end, kind="stable").tolist():
        while i < len(end) and end[i] <= sync_end[j]:
            delay = min(max(0, delay + int(wait[i]) - int(idle[i])), int(cap[i]))
            i += 1
        paid[j] = min(delay, int(sync_dur[j]))
        delay = 0
    return paid
