"""Which device waits lie on a step's critical path, and so what removing them saves.

A device that waits (for a dependency, a copy, another rank) makes the step longer only
when the host later waits for that device: a host-bound step queues its next work
meanwhile and is as long without the wait. So within a step, removing device waits of
W ns shortens it by at most min(W, S), S being the host's time waiting on the device in
that step: syncs (`.item()`, `.cpu()`, `synchronize`, `cudaStreamSynchronize`) and ops
that return only once their own device work has finished (blocking copies: the host's
op interval covers its kernel's end, and the overlap is the wait).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common.intervals import Union
from neuron_explorer.common.numba_available import numba_available

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def host_waits_per_step(trace: Trace) -> pd.Series:
    """The host's time waiting on the device in each analysed step (-1: the whole trace,
    when it has no steps): the step breakdown's `sync`, plus blocking ops' waits."""
    bd = trace.breakdown()
    sync = bd[(bd["side"] == "host") & (bd["category"] == "sync")].groupby("step")["ns"].sum()
    ts, dur = blocking_op_waits(trace)
    return sync.add(per_analysed_step(trace, ts, dur), fill_value=0)


def blocking_op_waits(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Where ops waited for their own device work: for each op whose host interval ends
    after its kernel does, the overlap of the two (start, length)."""
    k = trace.kernels
    if not len(k) or "op_slice_id" not in k:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = k[k["op_slice_id"].to_numpy() >= 0]
    s = trace.table("slices")
    op = k["op_slice_id"].to_numpy(np.int64)
    op_start = s["ts"].to_numpy(np.int64)[op]
    op_end = op_start + s["dur"].to_numpy(np.int64)[op]
    k_start = k["ts"].to_numpy(np.int64)
    k_end = k_start + k["dur"].to_numpy(np.int64)
    start = np.maximum(op_start, k_start)
    waited = (op_end >= k_end) & (k_end > start)
    return start[waited], (k_end - start)[waited]


def per_analysed_step(trace: Trace, ts: np.ndarray, dur: np.ndarray) -> pd.Series:
    """The sum of `dur` of intervals starting in each analysed step, indexed by step."""
    from neuron_explorer.analyses.step_breakdown import step_windows

    win = step_windows(trace).sort_values("ts")
    starts = win["ts"].to_numpy(np.int64)
    ends = starts + win["dur"].to_numpy(np.int64)
    ts = np.asarray(ts, np.int64)
    i = np.searchsorted(starts, ts, side="right") - 1
    inside = (i >= 0) & (ts < ends[np.maximum(i, 0)])
    steps = win["step"].to_numpy(np.int64)
    totals = np.bincount(i[inside], weights=np.asarray(dur, np.float64)[inside],
                         minlength=len(steps))
    return pd.Series(totals, index=steps)


# A step whose saving is past this many times the median step's is a one-time catch-up
# (a rank waiting once for another that started late), not a cost of every step.
CATCH_UP_FACTOR = 3


def device_wait_saving(trace: Trace, ts: np.ndarray, dur: np.ndarray) -> float:
    """What the analysed steps would save without the device waits [ts, ts + dur):
    per step, the waits or the host's sync time, whichever is less, capped at
    `CATCH_UP_FACTOR` times the median step's (a wait paid once is no per-step cost)."""
    waits = per_analysed_step(trace, ts, dur)
    sync = host_waits_per_step(trace).reindex(waits.index).fillna(0)
    saving = np.minimum(waits, sync)
    if len(saving) > 1:
        saving = saving.clip(upper=float(saving.median()) * CATCH_UP_FACTOR)
    return float(saving.sum())


def device_busy_ns(trace: Trace) -> float:
    """The device's busy time for the analysed steps' kernels (however far it lags
    behind their host windows)."""
    from neuron_explorer.analyses.phases import in_analysed_work

    kernels = in_analysed_work(trace, trace.kernels)
    ts = kernels["ts"].to_numpy(np.int64)
    return float(Union(ts, ts + kernels["dur"].to_numpy(np.int64)).total)


def device_time_saving(trace: Trace, device_ns: float, host_added_ns: float = 0.0) -> float:
    """What the analysed steps would save if the device needed `device_ns` less time.

    A step ends when both its host and its device are done: the host's own work H (the
    steps less the host's waits on the device, W), the device's busy time D (the kernels
    the steps launched, however far the device lags behind their host windows). The
    device's share of the steps is what it adds beyond the host: W, plus the lag D - S it
    builds where the host never waits (S: the host windows' total; D also as the device's
    pace measures it, `device_pace`, its idle between kernels included). Making the
    device faster by X saves min(X, W + max(D - S, 0)): nothing on a host-bound run, X on
    one the device sets, and only the part above the host's own time between the two.
    A fix that also adds host work H (autocast's casts, each an op to launch) saves
    min(X, W + max(D - S, 0) - H): the host's own time grows by H. Where the kernels name
    the slices that launched them, the recording is re-timed instead
    (`retimed_device_saving`): a device behind through a warm-up, or idle between
    launches, is behind by less than D - S, or by more.

    Only where the host's time is measured whole (our recordings: every interval of the
    host is its work or a wait the recorder marks). A PyTorch-profiler trace does not mark
    every wait (a launch queue that is full blocks inside cudaLaunchKernel), so its host
    windows are no floor, and the device time is returned as it is."""
    from neuron_explorer.analyses.statistics import total_step_ns
    from neuron_explorer.analyses.step_breakdown import step_windows
    from neuron_explorer.device_terms import device_terms

    if device_ns <= 0:
        return 0.0
    measured_host = device_terms(trace.metadata).recorded_here
    busy = device_busy_ns(trace)
    if not measured_host or not len(trace.steps) or not busy:
        return float(device_ns)  # nothing to weigh it against: the device's own time
    replayed = retimed_device_saving(trace, device_ns, host_added_ns)
    if replayed is not None:
        return float(min(device_ns, replayed))
    steps = float(step_windows(trace)["dur"].sum())  # the host's windows
    # the lag, also as the device's pace measures it (its idle between kernels included)
    lag = max(busy, total_step_ns(trace)) - steps
    waits = float(host_waits_per_step(trace).sum())
    return float(min(device_ns, waits + max(lag, 0.0) - host_added_ns))


# The re-timing walks the kernels one by one in Python (about 10 us each): past this
# many, each rule that states a device saving would add seconds to a report, and the
# lead's bound (busy time less the host's windows) stands instead.
RETIME_MAX_KERNELS = 200_000


def retimed_device_saving(trace: Trace, device_ns: float,
                          host_added_ns: float = 0.0) -> float | None:
    """How much sooner the analysed steps' work ends with their kernels `device_ns`
    shorter in all, each by the same share (and the host's last step end later by
    `host_added_ns`): the recording re-timed with those lengths (`what_if.kernel_retime`),
    each kernel launched when it was and the host's waits on the device shrinking with
    it. The device's lead over its host, as busy time less the host's windows, counted
    a warm-up's backlog as lead in every step: a device 1% slower than its host a step,
    0.7 ms behind after step 0 and idle between launches, was claimed 366 us for 366 us
    less device time, where its work ended 211 us sooner (a fix that took 668 us off it
    ended it 235 us sooner). None where the kernels name no launching slice, or there are
    more than RETIME_MAX_KERNELS of them."""
    from neuron_explorer.analyses.phases import in_analysed_work
    from neuron_explorer.analyses.step_breakdown import step_windows
    from neuron_explorer.tables import kernel_launches
    from neuron_explorer.what_if.kernel_retime import retime

    k = trace.kernels
    if len(k) > RETIME_MAX_KERNELS:
        return None
    windows = step_windows(trace)
    if not len(windows):
        return None
    # the analysed steps' kernels, by when their op launched them: a run's inputs made on
    # the device before its first step are counted in it, but their saving is lost to the
    # idle device before the step's first launch (an encoder's claim was 11% short)
    launcher = kernel_launches(trace)
    launched = np.where(launcher >= 0, trace.table("slices")["ts"].to_numpy(np.int64)[
        np.maximum(launcher, 0)], k["ts"].to_numpy(np.int64))
    rows = np.flatnonzero(k["id"].isin(in_analysed_work(trace, k)["id"]).to_numpy()
                          & (launched >= int(windows["ts"].min())))
    dur = k["dur"].to_numpy(np.int64)
    busy = float(dur[rows].sum())
    if not len(rows) or busy <= 0:
        return None
    shorter = (dur[rows] * (1 - min(device_ns / busy, 1.0))).astype(np.int64)
    retimed = retime(trace, np.zeros(0, np.int64),
                     lengths=dict(zip(rows.tolist(), shorter.tolist(), strict=True)))
    if retimed is None:
        return None
    host_end = int((windows["ts"] + windows["dur"]).max())
    old = max(host_end, int((k["ts"].to_numpy(np.int64) + dur)[rows].max()))
    new = max(int(retimed.host_time(np.array([host_end]))[0] + host_added_ns),
              int(retimed.end[rows].max()))
    return float(max(old - new, 0))


PATH_COLUMNS = ["step", "ts", "dur", "name", "kind", "category", "track", "rank"]
# kernels closer than this count as back to back (one kernel's end starts the next)
_TOUCH_NS = 1_000
_HOST_ORDER = ("dataloader", "compile", "op_dispatch")  # priority, as the step breakdown's


def critical_path(trace: Trace, step: int | None = None) -> pd.DataFrame:
    """The chain of work that sets each analysed step's length (or any recorded `step`'s,
    warm-up included), walked back
    from the step's end: the host's own work (`python`, `op_dispatch`, `dataloader`,
    `compile`) until it waited on the device at a sync; from there the device's kernels
    back along their queue (one kernel's end starting the next), across to another
    queue's kernel when one waited on it (`dependency`: a copy, a collective, an event),
    and back to the host where a kernel started only when the host launched it
    (`launch`: the launch latency). The segments of a step are contiguous and sum to the
    step. A collective is two segments: `collective_wait` (this rank's device waiting for
    the group's last rank) and `collective` (the transfer). Columns: step, ts, dur, name,
    kind (host | device), category, track, rank."""
    from neuron_explorer.analyses.idle import launch_ends, launch_times
    from neuron_explorer.analyses.step_breakdown import host_slices, step_windows
    from neuron_explorer.runs.files import distributed_info

    win = step_windows(trace)
    if step is not None:  # any recorded step, warm-up included
        steps = trace.steps
        win = (steps.loc[steps["step"] == step, ["step", "ts", "dur"]] if len(steps)
               else win[win["step"] == step])
    rank = int(distributed_info(trace.metadata).get("rank") or 0)
    if not len(win):
        return pd.DataFrame(columns=PATH_COLUMNS)
    s = trace.table("slices")
    hs = host_slices(trace)
    host = _HostTimeline(hs, *blocking_op_waits(trace))
    k = trace.kernels
    work = pd.DataFrame({
        "ts": k["ts"], "dur": k["dur"], "name": k["name"], "wait": 0, "collective": False,
        "track": s["track_id"].to_numpy()[k["id"].to_numpy(np.int64)] if len(k) else [],
        "launch": launch_times(trace, k) if len(k) else [],
        "launch_end": launch_ends(trace, k) if len(k) else []})
    device = _DeviceQueues(pd.concat([work, _collective_work(trace, s)], ignore_index=True))
    main_track = int(s.loc[trace.steps["id"].iloc[0], "track_id"]) if len(trace.steps) else -1
    if _compiled_walk_pays(len(device.ts)):
        return _compiled_paths(win, host, device, main_track, rank)
    rows: list[tuple] = []
    for w in win.itertuples():
        segments = _walk(int(w.ts), int(w.ts + w.dur), host, device, main_track)
        rows += [(int(w.step), *seg, rank) for seg in reversed(segments)]
    return pd.DataFrame(rows, columns=PATH_COLUMNS)


# Kernels from which the compiled walk is worth its start-up (importing numba and loading
# its cached code: about a second); below, the Python walk takes well under a second.
COMPILED_WALK_MIN = 100_000


def _compiled_walk_pays(n_kernels: int) -> bool:
    return n_kernels >= COMPILED_WALK_MIN and numba_available()


def _compiled_paths(win: pd.DataFrame, host: _HostTimeline, dev: _DeviceQueues,
                    main_track: int, rank: int) -> pd.DataFrame:
    """The paths of the step windows from the compiled walk, as the Python walk's rows."""
    from neuron_explorer.analyses import critical_path_compiled as cc

    parts, steps = [], []
    for w in win.itertuples():
        lo, hi = int(w.ts), int(w.ts + w.dur)
        budget = 4 * (len(dev.ts) + len(host.sync_end)) + 16
        seg = cc.walk(lo, hi, budget, host, dev)
        kept = seg[1][::-1] > 0  # earliest first, as the rows go; none of no length
        parts.append(tuple(a[::-1][kept] for a in seg))
        steps.append(np.full(int(kept.sum()), int(w.step), np.int64))
    ts, dur, what, ref = (np.concatenate([p[i] for p in parts]) for i in range(4))
    names, kinds, categories, tracks = _segment_texts(what, ref, host, dev, main_track)
    return pd.DataFrame({"step": np.concatenate(steps), "ts": ts, "dur": dur, "name": names,
                         "kind": kinds, "category": categories, "track": tracks,
                         "rank": np.full(len(ts), rank, np.int64)}, columns=PATH_COLUMNS)


def _segment_texts(what: np.ndarray, ref: np.ndarray, host: _HostTimeline,
                   dev: _DeviceQueues, main_track: int) -> tuple[np.ndarray, ...]:
    """Name, kind, category and track of the compiled walk's segments, as the Python walk
    words them."""
    from neuron_explorer.analyses import critical_path_compiled as cc

    n = len(what)
    name, kind, category = (np.empty(n, object) for _ in range(3))
    track = np.full(n, main_track, np.int64)
    host_names = np.array([*_HOST_ORDER, "python"], object)
    m = what == cc.HOST_WORK
    name[m] = category[m] = host_names[ref[m]]
    kind[m] = "host"
    for code, text in ((cc.SYNC, None), (cc.SYNC_LATENCY, "sync latency")):
        m = what == code
        name[m] = [str(v) for v in host.sync_name[ref[m]]] if text is None else text
        kind[m], category[m], track[m] = "host", "sync", host.sync_track[ref[m]]
    device = {cc.KERNEL: (None, "kernel"), cc.COLLECTIVE: (None, "collective"),
              cc.COLLECTIVE_WAIT: (": waiting for the group's last rank", "collective_wait"),
              cc.LAUNCH: ("launch", "launch"), cc.QUEUE: ("queue", "dependency"),
              cc.DEPENDENCY: ("dependency", "dependency")}
    for code, (text, cat) in device.items():
        m = what == code
        if code in (cc.KERNEL, cc.COLLECTIVE, cc.COLLECTIVE_WAIT):
            kernel_names = pd.Series(dev.name[ref[m]], dtype=object).map(str)
            name[m] = (kernel_names + text if text else kernel_names).to_numpy(object)
        else:
            name[m] = text
        kind[m], category[m], track[m] = "device", cat, dev.track[ref[m]]
    m = what == cc.UNEXPLAINED
    name[m], kind[m], category[m] = "unexplained", "host", "python"
    return name, kind, category, track


class _HostTimeline:
    """The host's waits on the device (syncs, and blocking ops' waits) and its work by
    category, for the walk."""

    def __init__(self, hs: pd.DataFrame, block_ts: np.ndarray, block_dur: np.ndarray) -> None:
        # a sync of no length (the device was done) is no wait: the walk, stepping back to
        # its end, would find it again at once and never get past it
        syncs = hs[(hs["kind"] == "sync") & (hs["dur"] > 0)]
        n = len(block_ts)
        self.sync_start = np.r_[syncs["ts"].to_numpy(np.int64), np.asarray(block_ts, np.int64)]
        self.sync_end = self.sync_start + np.r_[syncs["dur"].to_numpy(np.int64),
                                                np.asarray(block_dur, np.int64)]
        self.sync_name = np.r_[syncs["name"].to_numpy(object), np.full(n, "blocking op", object)]
        main = int(syncs["track_id"].iloc[0]) if len(syncs) else -1
        self.sync_track = np.r_[syncs["track_id"].to_numpy(np.int64), np.full(n, main, np.int64)]
        # sorted once, searched once per step of the walk: Python lists, whose bisect costs a
        # fraction of a numpy search for one value
        by_end = np.argsort(self.sync_end, kind="stable")
        self._by_end, self._ends_sorted = by_end.tolist(), self.sync_end[by_end].tolist()
        kinds = {"dataloader": ("dataloader",), "compile": ("compile",),
                 "op_dispatch": ("op", "runtime")}
        unions = {cat: Union(hs.loc[hs["kind"].isin(kind), "ts"].to_numpy(),
                             (hs.loc[hs["kind"].isin(kind), "ts"]
                              + hs.loc[hs["kind"].isin(kind), "dur"]).to_numpy())
                  for cat, kind in kinds.items()}
        starts, self._run_category = _host_runs(unions)
        self._run_start = starts.tolist()
        names = [*_HOST_ORDER, "python"]
        # what the compiled walk reads: the syncs' starts and ends, their ends sorted and
        # that order, the host's runs' starts and category codes (`_HOST_ORDER`, python)
        self.compiled = (self.sync_start, self.sync_end, self.sync_end[by_end], by_end,
                         starts, np.array([names.index(c) for c in self._run_category],
                                          np.int64))


    def last_sync_ending_by(self, t: int, lo: int) -> int:
        """Index of the sync that ended last at or before `t` and after `lo` (-1: none)."""
        i = bisect_right(self._ends_sorted, t) - 1
        return self._by_end[i] if i >= 0 and self._ends_sorted[i] > lo else -1

    def work(self, a: int, b: int, track: int) -> list[tuple]:
        """Segments of [a, b) by the host's category (latest first)."""
        if b <= a:
            return []
        starts = self._run_start
        first = bisect_right(starts, a) - 1  # the run holding a
        last = bisect_left(starts, b) - 1  # the last run starting before b
        out: list[tuple] = []
        for k in range(first, last + 1):
            x0 = max(int(starts[k]), a)
            x1 = min(int(starts[k + 1]), b) if k + 1 < len(starts) else b
            cat = self._run_category[k]
            out.append((x0, x1 - x0, cat, "host", cat, track))
        return out[::-1]


def _host_runs(unions: dict[str, Union]) -> tuple[np.ndarray, list[str]]:
    """The host's time cut into runs of one category, once for the walk: each stretch
    between the unions' bounds takes the first category (in `_HOST_ORDER`) whose union
    covers it, else "python"; equal neighbours are one run. Returns each run's start (the
    first from the earliest time there is) and its category; a run lasts to the next."""
    bounds = np.concatenate([np.r_[u.starts, u.ends] for u in unions.values()])
    # sorted runs, merged by a stable sort, then deduplicated: numpy 2.4's np.unique hashes
    # every value, 2 s where they are millions and distinct, against 40 ms for this
    bounds.sort(kind="stable")
    bounds = bounds[np.r_[True, bounds[1:] != bounds[:-1]]] if len(bounds) else bounds
    if not len(bounds):  # no host work recorded: all python
        return np.array([np.iinfo(np.int64).min]), ["python"]
    names = [*_HOST_ORDER, "python"]
    which = np.full(max(len(bounds) - 1, 0), len(_HOST_ORDER), np.int64)
    for i in reversed(range(len(_HOST_ORDER))):  # the first in the order wins
        a, b = bounds[:-1], bounds[1:]
        which[unions[_HOST_ORDER[i]].covered(a, b) == b - a] = i
    # before the first bound and after the last: python
    which = np.r_[len(_HOST_ORDER), which, len(_HOST_ORDER)]
    starts = np.r_[np.iinfo(np.int64).min, bounds]
    change = np.r_[True, which[1:] != which[:-1]]
    return starts[change], [names[i] for i in which[change].tolist()]


def _collective_work(trace: Trace, s: pd.DataFrame) -> pd.DataFrame:
    """The collectives as work on their device queues (our recordings: a slice from this
    rank's arrival through the wait for the group's last rank to the transfer's end)."""
    coll = trace.collectives()
    coll = coll[coll["wait_ns"] >= 0]
    ids = coll["id"].to_numpy(np.int64)
    op = trace.slice_args.numbers("op_id", ids, default=-1)
    ops = trace.ops
    launch = pd.Series(ops["ts"].to_numpy(np.int64), index=ops["op_id"].to_numpy()) \
        if len(ops) and "op_id" in ops else pd.Series(dtype=np.int64)
    launch = launch[~launch.index.duplicated()]  # a hostile trace may repeat op ids
    return pd.DataFrame({
        "ts": coll["ts"].to_numpy(np.int64), "dur": coll["dur"].to_numpy(np.int64),
        "name": [f"{c} #{q}" for c, q in zip(coll["collective"], coll["seq"], strict=True)],
        "wait": coll["wait_ns"].to_numpy(np.int64), "collective": True,
        "track": s["track_id"].to_numpy()[ids] if len(ids) else np.zeros(0, np.int64),
        "launch": launch.reindex(op).fillna(-1).to_numpy(np.int64),
        "launch_end": launch.reindex(op).fillna(-1).to_numpy(np.int64)})


class _DeviceQueues:
    """Kernels and collectives by queue (track), sorted, with their launch times and (for
    collectives) their wait for the group's last rank."""

    def __init__(self, work: pd.DataFrame) -> None:
        order = np.argsort(work["ts"].to_numpy(np.int64), kind="stable")
        self.ts = work["ts"].to_numpy(np.int64)[order]
        self.end = self.ts + work["dur"].to_numpy(np.int64)[order]
        self.name = work["name"].to_numpy()[order]
        self.wait = work["wait"].to_numpy(np.int64)[order]
        self.collective = work["collective"].to_numpy(bool)[order]
        self.track = work["track"].to_numpy(np.int64)[order]
        self.launch = work["launch"].to_numpy(np.int64)[order]
        self.launch_end = np.maximum(work["launch_end"].to_numpy(np.int64)[order], self.launch)
        # kernels by end time (and index at equal ends), all and per queue: the walk asks
        # which ended last before a time once per kernel on the path, each a binary search
        self._by_end = _EndOrder(np.arange(len(self.end)), self.end)
        queues, self._queue_of = np.unique(self.track, return_inverse=True)
        self._queue_by_end = {int(q): _EndOrder(np.flatnonzero(self._queue_of == i), self.end)
                              for i, q in enumerate(queues.tolist())}

    @cached_property  # the walk of each step window reads them: built once
    def compiled(self) -> tuple[np.ndarray, ...]:
        """What the compiled walk reads: the kernels' times, waits, kinds and launches,
        each one's queue, the kernels by end (all, then per queue, one after another)."""
        per_queue = list(self._queue_by_end.values())
        ptr = np.cumsum([0, *(len(q.kernel_array) for q in per_queue)])
        return (self.ts, self.end, self.wait, self.collective, self.launch, self.launch_end,
                self._queue_of.astype(np.int64), self._by_end.end_array,
                self._by_end.kernel_array, ptr.astype(np.int64),
                np.concatenate([q.end_array for q in per_queue] or [np.zeros(0, np.int64)]),
                np.concatenate([q.kernel_array for q in per_queue]
                               or [np.zeros(0, np.int64)]))

    def ending_by(self, t: int, track: int | None = None, exclude: int = -1) -> int:
        """The kernel (index) that ended last at or before `t` (on `track`, if given),
        other than `exclude`; the first of those ending at the same time."""
        if track is None:
            return self._by_end.last_by(t, exclude)
        queue = self._queue_by_end.get(track)
        return queue.last_by(t, exclude) if queue is not None else -1


class _EndOrder:
    """Some kernels sorted by (end, index), for `last_by`."""

    def __init__(self, kernels: np.ndarray, end: np.ndarray) -> None:
        order = np.lexsort((kernels, end[kernels]))
        self.kernel_array = kernels[order].astype(np.int64)
        self.end_array = end[kernels][order].astype(np.int64)

    @cached_property
    def kernel(self) -> list[int]:  # lists: bisect, as in _HostTimeline
        return self.kernel_array.tolist()

    @cached_property
    def end(self) -> list[int]:
        return self.end_array.tolist()

    def last_by(self, t: int, exclude: int) -> int:
        """The kernel that ended last at or before `t`, other than `exclude`: of those
        ending at that time, the lowest index."""
        i = bisect_right(self.end, t) - 1
        while i >= 0:
            first = bisect_left(self.end, self.end[i])
            for j in range(first, i + 1):  # ties at that end: lowest index first
                if self.kernel[j] != exclude:
                    return self.kernel[j]
            i = first - 1  # only `exclude` ended then: the end before
        return -1


def _walk(lo: int, hi: int, host: _HostTimeline, dev: _DeviceQueues,
          main_track: int) -> list[tuple]:
    """Segments (ts, dur, name, kind, category, track) from `hi` back to `lo`, latest first."""
    out: list[tuple] = []
    t, on_host, kernel = hi, True, -1
    for _ in range(4 * (len(dev.ts) + len(host.sync_end)) + 16):
        if t <= lo:
            break
        if on_host:
            i = host.last_sync_ending_by(t, lo)
            start = max(int(host.sync_end[i]) if i >= 0 else lo, lo)
            out += host.work(start, t, main_track)
            t = start
            if i < 0 or t <= lo:
                break
            # the host waited on the device until here: the device's last kernel set it
            kernel = dev.ending_by(t)
            if kernel < 0 or dev.end[kernel] <= max(lo, int(host.sync_start[i])):
                # the device had nothing left: the sync itself is the host's time
                s0 = max(int(host.sync_start[i]), lo)
                out.append((s0, t - s0, str(host.sync_name[i]), "host", "sync",
                            int(host.sync_track[i])))
                t = s0
                continue
            if dev.end[kernel] < t:
                out.append((int(dev.end[kernel]), t - int(dev.end[kernel]), "sync latency",
                            "host", "sync", int(host.sync_track[i])))
                t = int(dev.end[kernel])
            on_host = False
            continue
        # on the device, inside `kernel`, at t
        k0 = max(int(dev.ts[kernel]), lo)
        track = int(dev.track[kernel])
        if dev.collective[kernel]:  # its transfer, then its wait for the group's last rank
            last = min(max(k0, int(dev.ts[kernel] + max(dev.wait[kernel], 0))), t)
            out.append((last, t - last, str(dev.name[kernel]), "device", "collective", track))
            waiting = f"{dev.name[kernel]}: waiting for the group's last rank"
            out.append((k0, last - k0, waiting, "device", "collective_wait", track))
        else:
            out.append((k0, t - k0, str(dev.name[kernel]), "device", "kernel", track))
        t = k0
        if t <= lo:
            break
        # what let it start: the latest of its queue's previous kernel ending, another
        # queue's kernel ending (a copy, a collective, an event), and its launch
        prev = dev.ending_by(t, track, exclude=kernel)
        other = dev.ending_by(t, exclude=kernel)
        causes = [(int(dev.launch[kernel]), "launch", -1)]
        if prev >= 0:
            causes.append((int(dev.end[prev]), "queue", prev))
        if other >= 0 and other != prev and other != kernel:
            causes.append((int(dev.end[other]), "dependency", other))
        when, why, before = max(causes, key=lambda c: (c[0], c[1] != "launch"))
        when = min(max(when, lo), t)
        if why == "launch":  # it started only when the host launched it: from the launch's
            # return (the host's time inside the call is its own work) to the start
            when = min(max(int(dev.launch_end[kernel]), when), t)
            out.append((when, t - when, "launch", "device", "launch", track))
            t, on_host = when, True
            continue
        if when < t:  # a wait with nothing recorded to explain it, or a hop's latency
            out.append((when, t - when, why, "device", "dependency", track))
            t = when
        kernel = before
    if t > lo:  # the walk's budget ran out: the rest as the host's
        out.append((lo, t - lo, "unexplained", "host", "python", main_track))
    return [seg for seg in out if seg[1] > 0]
