"""Which of a device's waits held its host up, matched by time rather than by step.

A device that waits (at a collective, for a late rank) delays every kernel queued after
the wait, until it next runs out of work: idle time, where it waited for the host to
launch more, absorbs the delay. The host pays what is left only when it then waits for
the device (a sync, or an op blocking on its own kernel), and at most that wait's
length; after the sync host and device start level again. The sync that pays may lie
in the next step (a loss read after `optimizer.step()` waits out the last step's
all-reduce), so waits and syncs are matched in time, not per step.

`host_syncs` and `idle_after` read one rank's trace (a rank's digest keeps their
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


def delays_at_syncs(coll: pd.DataFrame, syncs: pd.DataFrame) -> np.ndarray:
    """Per row of `syncs`: how much shorter that host wait would be without the waits of
    `coll` (`ts`, `dur`, `wait_ns`, `idle_after_ns`), each wait carried forward on its
    device until idle time absorbs it or a sync pays it."""
    paid = np.zeros(len(syncs), np.int64)
    if not len(coll) or not len(syncs):
        return paid
    end = (coll["ts"] + coll["dur"]).to_numpy(np.int64)
    order = np.argsort(end, kind="stable")
    end = end[order]
    wait = np.maximum(coll["wait_ns"].to_numpy(np.int64)[order], 0)
    idle = coll["idle_after_ns"].to_numpy(np.int64)[order]
    sync_end = (syncs["ts"] + syncs["dur"]).to_numpy(np.int64)
    sync_dur = syncs["dur"].to_numpy(np.int64)
    delay, i = 0, 0
    for j in np.argsort(sync_end, kind="stable").tolist():
        while i < len(end) and end[i] <= sync_end[j]:
            delay = max(0, delay + int(wait[i]) - int(idle[i]))
            i += 1
        paid[j] = min(delay, int(sync_dur[j]))
        delay = 0
    return paid
