"""Re-time a recording with some host slices removed, each kernel keeping its recorded
length: the counterfactual for traces the backend replay cannot re-lower (compiled
graphs, PyTorch-profiler traces from any device).

The host keeps its recorded time less the removed slices and the host time that goes
with them (`host_gaps`: the Python between two removed slices, a removed op's own front
end; `what_if.counterfactual` says which): every later host time moves earlier by as
much. A kernel is launched when its launching slice issued
it (its recorded start or the launching slice's end, whichever came first) and starts
once its queue is free, plus any delay the recording shows beyond both (a wait on
another queue, kept as it was). A sync waits for the queues it waited for in the
recording (those whose last kernel launched before it had ended by its end) until their
kernels launched before it have finished; the part of its recorded time that was not
that wait is kept, and every host time after it moves by how much shorter (or longer)
the wait got. A kernel whose launching slice, or a slice around it, is removed is gone
with it. Re-timed with nothing removed, the recording comes back unchanged.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.intervals import Union
from neuron_explorer.tables import innermost_in, kernel_launches, number, of_kind

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


@dataclass(frozen=True)
class Retimed:
    """The recording re-timed: per row of `trace.kernels` its recorded launch time and
    its new end (-1: removed), and the host shift as (recorded end of each change, its
    change in ns)."""

    launch: np.ndarray
    end: np.ndarray
    shift_at: np.ndarray
    shift_by: np.ndarray

    def host_time(self, ts: np.ndarray) -> np.ndarray:
        """The new times of recorded host times `ts`."""
        ts = np.asarray(ts, np.int64)
        order = np.argsort(self.shift_at, kind="stable")
        total = np.r_[0, np.cumsum(self.shift_by[order])].astype(np.int64)
        return ts + total[np.searchsorted(self.shift_at[order], ts, side="right")]


def retime(trace: Trace, removed: np.ndarray,
           host_gaps: tuple[np.ndarray, np.ndarray] | None = None,
           lengths: dict[int, int] | None = None) -> Retimed | None:
    """The trace re-timed without the slices `removed` (ids: host slices, with the kernels
    they launched, or kernels by themselves) and the host time between them in
    `host_gaps` (starts, ends), the kernels of `lengths` (row of `trace.kernels` -> ns)
    running that long instead (a fix that changes a kernel: one fused kernel for many);
    None for a trace whose kernels name no launching slice."""
    k = trace.kernels
    launcher = kernel_launches(trace) if len(k) else np.zeros(0, np.int64)
    if not (launcher >= 0).any():
        return None
    s = trace.table("slices")
    parent = s["parent_id"].to_numpy(np.int64)
    gone = np.zeros(len(s), bool)
    gone[np.asarray(removed, np.int64)] = True
    host_tracks = trace.tracks.loc[trace.tracks["device"] < 0, "track_id"].to_numpy()
    on_host = np.isin(s["track_id"].to_numpy(), host_tracks)
    s_ts, s_dur = s["ts"].to_numpy(np.int64), s["dur"].to_numpy(np.int64)

    start, dur = k["ts"].to_numpy(np.int64), k["dur"].to_numpy(np.int64)
    known = launcher >= 0
    launch = start.copy()
    launch[known] = np.minimum(start[known], (s_ts + s_dur)[launcher[known]])
    kept = ~known.copy()
    kept[known] = innermost_in(parent, gone, launcher[known]) < 0
    kept &= ~gone[k["id"].to_numpy(np.int64)]  # a kernel removed by itself
    queue = s["track_id"].to_numpy()[k["id"].to_numpy(np.int64)]
    slack = _slack(start, dur, launch, queue)
    runs = dur.copy()
    for row, ns in (lengths or {}).items():
        runs[row] = ns

    syncs = of_kind(trace, tf.CAT_SYNC)
    sync_kept = innermost_in(parent, gone, syncs["id"].to_numpy(np.int64)) < 0
    gap_starts, gap_ends = host_gaps if host_gaps is not None else ((), ())
    removed_host = Union(np.r_[s_ts[gone & on_host], gap_starts],
                         np.r_[(s_ts + s_dur)[gone & on_host], gap_ends])
    end, sync_at, sync_by = _walk(
        launch, start, dur, runs, slack, kept, queue, k["device"].to_numpy(np.int64),
        syncs["ts"].to_numpy(np.int64), syncs["dur"].to_numpy(np.int64), sync_kept,
        number(trace, tf.ARG_DEVICE, syncs["id"].to_numpy(), default=-1).astype(np.int64),
        removed_host)
    return Retimed(launch, end, np.r_[removed_host.ends, sync_at].astype(np.int64),
                   np.r_[-(removed_host.ends - removed_host.starts), sync_by].astype(np.int64))


def _slack(start: np.ndarray, dur: np.ndarray, launch: np.ndarray,
           queue: np.ndarray) -> np.ndarray:
    """How much later each kernel started than both its launch and its queue's previous
    kernel allowed: a wait the recording shows on something else, kept as recorded."""
    order = np.lexsort((start, queue))
    ordered = pd.DataFrame({"queue": queue[order], "end": (start + dur)[order]})
    # the queue is free once every earlier kernel on it has ended
    reach = ordered.groupby("queue")["end"].cummax().to_numpy(np.int64)
    q = ordered["queue"].to_numpy()
    free = np.full(len(order), np.iinfo(np.int64).min)
    free[1:] = np.where(q[1:] == q[:-1], reach[:-1], free[1:])
    out = np.zeros(len(order), np.int64)
    out[order] = np.maximum(0, start[order] - np.maximum(launch[order], free))
    return out


def _walk(launch, start, dur, runs, slack, kept, queue, device, sync_ts, sync_dur, sync_kept,
          sync_device, removed_host: Union):
    """Place the kept kernels (each running `runs` long, recorded `dur`) and re-time the
    kept syncs in recorded host order: (each kernel's new end, -1 if removed; each sync's
    recorded end and its change in length)."""
    host_shift = -_removed_before(removed_host, launch)
    sync_shift = -_removed_before(removed_host, sync_ts)
    # kernels before syncs at the same time: a sync waits for what was launched by then
    events = sorted([(int(t), 0, i) for i, t in enumerate(launch.tolist())]
                    + [(int(t), 1, i) for i, t in enumerate(sync_ts.tolist())])
    end = np.full(len(launch), -1, np.int64)
    device_state = _Devices()
    pending: list[tuple[int, int]] = []  # (recorded end, change) of syncs not yet passed
    passed = 0  # the changes of syncs that ended by now
    at, by = [], []
    for t, is_sync, i in events:
        while pending and pending[0][0] <= t:
            passed += heapq.heappop(pending)[1]
        if is_sync:
            recorded, dev = int(sync_dur[i]), int(sync_device[i])
            device_state.note_hidden_work(dev, t, recorded)
            if not sync_kept[i]:
                continue
            length = device_state.sync_length(dev, t, recorded, t + int(sync_shift[i]) + passed)
            if length != recorded:
                heapq.heappush(pending, (t + recorded, length - recorded))
                at.append(t + recorded)
                by.append(length - recorded)
            continue
        q, dev = int(queue[i]), int(device[i])
        device_state.recorded[q] = (dev, int(start[i] + dur[i]))
        if kept[i]:
            begin = max(t + int(host_shift[i]) + passed, device_state.free(q, dev)) + int(slack[i])
            end[i] = device_state.new[q] = begin + int(runs[i])
    return end, np.array(at, np.int64), np.array(by, np.int64)


def _removed_before(removed_host: Union, ts: np.ndarray) -> np.ndarray:
    """How much removed host time lies before each time in `ts`."""
    return removed_host.covered(np.full(len(ts), np.iinfo(np.int64).min // 2), ts)


class _Devices:
    """The queues as the walk has placed them so far."""

    def __init__(self) -> None:
        self.new: dict[int, int] = {}  # queue -> new end of its last kept kernel
        self.recorded: dict[int, tuple[int, int]] = {}  # queue -> (device, recorded end)
        # device (-1: every one) -> until when it ran work the trace does not hold
        self.hidden: dict[int, int] = {}

    def free(self, queue: int, device: int) -> int:
        """When `queue` (on `device`) can start its next kernel."""
        return max(self.new.get(queue, 0), self.hidden.get(device, 0), self.hidden.get(-1, 0))

    def note_hidden_work(self, device: int, ts: int, recorded: int) -> None:
        """A sync before the trace holds any kernel of its device waited for work launched
        before the recording began (a `--steps` window): that work ends where the wait
        did, whatever is removed after it."""
        if not any(device < 0 or d == device for d, _ in self.recorded.values()):
            self.hidden[device] = max(self.hidden.get(device, 0), ts + recorded)

    def sync_length(self, device: int, ts: int, recorded: int, new_ts: int) -> int:
        """A sync's new length: it waited for the queues (of its device, where it names
        one) whose last kernel launched before it had ended by its end, the recording
        shows, and for hidden work; the rest of its recorded length was not waiting."""
        waited = [q for q, (d, old_end) in self.recorded.items()
                  if (device < 0 or d == device) and old_end <= ts + recorded]
        hidden = max(self.hidden.get(device, 0), self.hidden.get(-1, 0))
        old = max([self.recorded[q][1] for q in waited] + [hidden], default=ts)
        new = max([self.new.get(q, 0) for q in waited] + [hidden], default=new_ts)
        return recorded - min(max(old - ts, 0), recorded) + max(new - new_ts, 0)
