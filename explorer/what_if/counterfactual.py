"""What a finding's fix saves, by replaying the run with its cause removed.

The run is re-timed from its recorded kernels (`kernel_retime`) twice: as recorded, and
with the cause's slices removed (their host time and their device work gone; sync waits
derived again, so a step that waited for them waits less). The analysed steps'
difference between the two is the fix's saving. Each kernel keeps its recorded length,
so an eager recording, a compiled one, a `--steps` window and a PyTorch-profiler trace
from any device are replayed alike. Traces it cannot replay (no steps, or kernels that
name no launching slice) get None, and rules fall back on the critical path
(`analyses.path_share`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import kept, memoised
from neuron_explorer.tables import of_kind

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def removal_saving_ns(trace: Trace, op_ids: np.ndarray, cause: str,
                      lengths: dict[int, int] | None = None,
                      host_cut: tuple[np.ndarray, np.ndarray] | None = None) -> float | None:
    """ns the analysed steps would save if the program never issued the slices `op_ids`
    (host slices with their kernels, or kernels alone; `cause` names them, for the
    cache), the kernels of `lengths` (row of `trace.kernels` -> ns) ran that long, and the
    host time `host_cut` (starts, ends) went too, by replay; None where the trace cannot
    be replayed."""
    base = _replayed_span(trace, "as recorded", np.zeros(0, np.int64))
    if base is None or not (len(op_ids) or host_cut is not None or lengths):
        return None
    without = _replayed_span(trace, cause, np.asarray(op_ids, np.int64), lengths, host_cut)
    if without is None:
        return None
    return float(max(base - without, 0.0))


def first_step_extra_ns(trace: Trace, cause: str) -> float:
    """Of the saving the replay `cause` found (`removal_saving_ns`), the part the first
    analysed step saves once beyond what each other step saves (the median): an
    optimizer's state made in its first step, a one-time copy; below 0 where it saves that
    much less (a compiled LSTM's first step after the compile had no `.item()` wait from
    the step before: its syncs were claimed 57 us a step where each later step saved 138);
    0 where the difference is under a tenth of the saving, or the replay was not made."""
    replayed, recorded = kept(trace, f"counterfactual:{cause}"), \
        kept(trace, "counterfactual:as recorded")
    if replayed is None or recorded is None or len(replayed[1]) < 3:
        return 0.0
    per_step = recorded[1] - replayed[1]
    extra = float(per_step[0] - np.median(per_step[1:]))
    return extra if abs(extra) > 0.1 * max(abs(float(per_step.sum())), 1.0) else 0.0


def op_host_ns(trace: Trace, op_ids: np.ndarray) -> np.ndarray:
    """The host time of the given op slices: each op itself and the host's time since the
    op before it on its thread ended (the program's Python, PyTorch's front end: all of
    an `empty`'s cost)."""
    cost = memoised(trace, "op_host_ns", lambda: _op_host_costs(trace))
    return cost.reindex(op_ids).fillna(0).to_numpy(np.float64)


def _op_host_costs(trace: Trace) -> pd.Series:
    """`op_host_ns` of every op, by op slice id (two rules ask, one of them twice)."""
    ops = trace.ops.sort_values(["track_id", "ts"], kind="stable")
    ts = ops["ts"].to_numpy(np.int64)
    # a nested op's parent ends after it: the running latest end on its thread
    latest = (ops["ts"] + ops["dur"]).groupby(ops["track_id"].to_numpy()).cummax().to_numpy()
    track = ops["track_id"].to_numpy()
    before = np.zeros(len(ops), np.int64)
    same = track[1:] == track[:-1]
    before[1:] = np.where(same, np.maximum(ts[1:] - latest[:-1], 0), 0)
    return pd.Series(ops["dur"].to_numpy(np.int64) + before, index=ops["id"].to_numpy())


def op_kernel_rows(trace: Trace) -> dict[int, list[int]]:
    """Each op slice's kernels, as rows of `trace.kernels` (the rows a replay's `lengths`
    name), in launch order."""
    k = trace.kernels
    if not len(k) or "op_slice_id" not in k:
        return {}
    rows: dict[int, list[int]] = {}
    for row, op in enumerate(k["op_slice_id"].to_numpy(np.int64).tolist()):
        if op >= 0:
            rows.setdefault(op, []).append(row)
    return rows


def _replayed_span(trace: Trace, cause: str, removed: np.ndarray,
                   lengths: dict[int, int] | None = None,
                   host_cut: tuple[np.ndarray, np.ndarray] | None = None) -> float | None:
    """The analysed steps' replayed length, with the slices `removed` left out, timed as
    the report times a recording (`device_pace.paced_lengths`): the sum of the steps' host
    windows or, where the device falls behind its host, of its intervals per step. Its
    last step's device work running on past the host's window counts only then: timed to
    the last kernel's end as well, a compiled CNN's fused optimizer was claimed 635 us
    where the recorded fix's analysed steps took 739 us less (the replay's steps took 763)."""
    def compute() -> tuple[float, np.ndarray] | None:
        if not len(trace.steps):
            return None
        steps = in_analysed_steps(trace, trace.steps).sort_values("ts")
        return _span(trace, removed, steps, lengths, host_cut)

    # kept with each step's replayed window, for `first_step_extra_ns`
    span = memoised(trace, f"counterfactual:{cause}", compute)
    return None if span is None else span[0]


def _host_gaps(trace: Trace, removed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the host time that goes with the removed slices, though in none
    of them: between two removed slices that follow each other under one parent on one
    thread, the Python that issued the second (a `.item()`'s read, then its wait); and
    beside a removed op of our recordings, its own front end (the line that calls it,
    PyTorch's binding): on the modelled clock the per-op cost it charged, after the op
    (to the next interval); on a measured one before the op, at most the run's typical
    gap between two ops (`_op_gap_ns`). Other traces say nothing of it: none."""
    s = trace.table("slices")
    parent = s["parent_id"].to_numpy()
    host_tracks = trace.tracks.loc[trace.tracks["device"] < 0, "track_id"].to_numpy()
    family = s[np.isin(parent, np.unique(parent[removed]))
               & np.isin(s["track_id"].to_numpy(), host_tracks)].sort_values(
        ["track_id", "parent_id", "ts"], kind="stable")
    track, up = family["track_id"].to_numpy(), family["parent_id"].to_numpy()
    ts = family["ts"].to_numpy(np.int64)
    end = ts + family["dur"].to_numpy(np.int64)
    gone = np.isin(family["id"].to_numpy(), removed)
    next_to = (track[1:] == track[:-1]) & (up[1:] == up[:-1]) & (ts[1:] > end[:-1])
    both = next_to & gone[1:] & gone[:-1]
    starts, ends = [end[:-1][both]], [ts[1:][both]]
    op = (family["kind"].to_numpy() == tf.CAT_OP) & gone
    # on the modelled clock, an op alone in its parent (a Dropout module's one op): its
    # front end runs on to the parent's end (a teacher's dropout was claimed 0.72x of what
    # .eval() saved)
    same = (track[1:] == track[:-1]) & (up[1:] == up[:-1])
    last = op & np.r_[~same, True]
    s_end = (s["ts"] + s["dur"]).to_numpy(np.int64)
    clock = trace.metadata.get(tf.META_HOST_CLOCK) or {}
    if clock.get("source") == "modelled":  # the op's front end follows it, as charged
        cap = int(clock.get("python_per_op_ns", 0)) + int(clock.get("backend_op_ns", 0))
        lone = next_to & op[:-1] & ~gone[1:]
        starts.append(end[:-1][lone])
        ends.append(np.minimum(ts[1:][lone], end[:-1][lone] + cap))
        last &= up >= 0
        starts.append(end[last])
        ends.append(np.maximum(np.minimum(s_end[up[last]], end[last] + cap), end[last]))
    elif clock:  # measured: it precedes the op
        cap = _op_gap_ns(trace)
        lone = next_to & op[1:] & ~gone[:-1]
        starts.append(np.maximum(end[:-1][lone], ts[1:][lone] - cap))
        ends.append(ts[1:][lone])
    return np.concatenate(starts), np.concatenate(ends)


def _op_gap_ns(trace: Trace) -> int:
    """The run's typical host time between two ops that follow each other under one
    parent (the median): on a measured clock, what issuing one more op costs the host
    besides its slice."""
    def compute() -> int:
        ops = of_kind(trace, tf.CAT_OP).sort_values(["track_id", "parent_id", "ts"],
                                                    kind="stable")
        track, up = ops["track_id"].to_numpy(), ops["parent_id"].to_numpy()
        ts = ops["ts"].to_numpy(np.int64)
        end = ts + ops["dur"].to_numpy(np.int64)
        gap = (ts[1:] - end[:-1])[(track[1:] == track[:-1]) & (up[1:] == up[:-1])]
        gap = gap[gap > 0]
        return int(np.median(gap)) if len(gap) else 0

    return memoised(trace, "counterfactual:op_gap", compute)


def _span(trace: Trace, removed: np.ndarray, steps: pd.DataFrame,
          lengths: dict[int, int] | None = None,
          host_cut: tuple[np.ndarray, np.ndarray] | None = None
          ) -> tuple[float, np.ndarray] | None:
    """The `steps` (recorded windows, in order) re-timed without `removed` and the host
    time `host_cut` (and with the kernel `lengths`): their total length as the report
    times steps (`device_pace.paced_lengths`), and each step's length."""
    from neuron_explorer.analyses.device_pace import paced_lengths
    from neuron_explorer.analyses.phases import split_phases
    from neuron_explorer.what_if.kernel_retime import retime

    gaps = _host_gaps(trace, removed)
    if host_cut is not None:
        gaps = (np.r_[gaps[0], host_cut[0]].astype(np.int64),
                np.r_[gaps[1], host_cut[1]].astype(np.int64))
    retimed = retime(trace, removed, gaps, lengths)
    if retimed is None:
        return None
    starts = steps["ts"].to_numpy(np.int64)
    new_starts = retimed.host_time(starts)
    windows = (retimed.host_time(starts + steps["dur"].to_numpy(np.int64))
               - new_starts).astype(np.float64)
    # each step's device work ends with its last kernel (the report's `_device_ends`);
    # a run that also evaluates is timed by its windows, as the report times it
    kernel_step = trace.kernels["step"].to_numpy(np.int64)
    ran = retimed.end >= 0
    ran &= kernel_step >= 0  # work outside every step (before the first) starts none
    device_ends = pd.Series(retimed.end[ran]).groupby(kernel_step[ran]).max()
    numbers = steps["step"].to_numpy(np.int64)
    mine = device_ends.reindex(numbers).to_numpy(np.float64)
    before = device_ends.reindex(numbers - 1).to_numpy(np.float64)
    intervals = np.full(len(numbers), np.nan) if split_phases(trace) else mine - before
    lengths_now = paced_lengths(windows, intervals, mine - new_starts)
    return float(lengths_now.sum()), lengths_now
