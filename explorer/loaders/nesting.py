"""Slice nesting, vectorised: depth and parent of each slice on its track.

Both loaders end here. Complete slices (ts, dur) are turned into a stream of
begin/end events per track; a running depth per track then gives each slice its
depth, and the parent of a slice at depth d is the latest slice at depth d-1
begun before it on the same track. Begin/end pairs from a Perfetto trace are
matched the same way (an end closes the latest open begin at its depth). A point
(a flow's end, an instant) binds to the deepest slice holding it: `bind_flow_points`,
which both loaders use.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _running_depth(track: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Depth after each event of a stream sorted by track (resets at each new track)."""
    depth = np.cumsum(delta, dtype=np.int64)
    if len(track):
        first = np.r_[True, track[1:] != track[:-1]]
        base = depth[first] - delta[first]  # depth before the track's first event
        depth -= np.repeat(base, np.diff(np.r_[np.flatnonzero(first), len(track)]))
    return depth


def _present(depth: np.ndarray) -> list[int]:
    """The distinct values of non-negative small ints, ascending (a count, not a sort)."""
    if not len(depth):
        return []
    return np.flatnonzero(np.bincount(depth)).tolist()


# Few nesting depths (real traces have a handful): one vectorised pass per depth is the
# fastest. Deeper nesting (identical slices nest in each other) takes one sort instead,
# so that the time stays n log n whatever the depth.
FEW_DEPTHS = 16


def _latest_at_depth(depth: np.ndarray, pos: np.ndarray, q_depth: np.ndarray,
                     q_pos: np.ndarray) -> np.ndarray:
    """For each query, the index of the item at depth `q_depth` with the greatest `pos`
    below `q_pos` (-1: none), found with one sort of every item by (depth, pos)."""
    out = np.full(len(q_depth), -1, np.int64)
    if not len(depth) or not len(q_depth):
        return out
    span = np.int64(max(int(pos.max()), int(q_pos.max())) + 1)
    key = depth.astype(np.int64) * span + pos
    order = np.argsort(key, kind="stable")
    j = np.searchsorted(key[order], q_depth.astype(np.int64) * span + q_pos) - 1
    found = order[np.maximum(j, 0)]
    ok = (j >= 0) & (depth[found] == q_depth)
    out[ok] = found[ok]
    return out


def _parents(order_pos: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For begins given by stream position and depth, the index of each one's parent (-1)."""
    parent = np.full(len(depth), -1, dtype=np.int64)
    if not len(depth):
        return parent
    present = _present(depth)
    if len(present) > FEW_DEPTHS:
        child = np.flatnonzero(depth > 0)
        parent[child] = _latest_at_depth(depth, order_pos, depth[child] - 1, order_pos[child])
        return parent
    by_depth: dict[int, np.ndarray] = {}
    for d in present:
        idx = np.flatnonzero(depth == d)
        by_depth[int(d)] = idx[np.argsort(order_pos[idx], kind="stable")]
    for d, idx in by_depth.items():
        if d <= 0 or d - 1 not in by_depth:
            continue
        cand = by_depth[d - 1]
        j = np.searchsorted(order_pos[cand], order_pos[idx]) - 1
        ok = j >= 0
        parent[idx[ok]] = cand[j[ok]]
    return parent


def track_time_order(track: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Indices sorted by (track, ts), file order kept at equal keys."""
    if not len(ts):
        return np.zeros(0, np.int64)
    lo = int(ts.min())
    span = int(ts.max()) - lo + 1
    if (int(track.max()) + 1) * span < (1 << 62):  # one int64 key: a single stable sort
        key = track.astype(np.int64)  # built in place: one array of the trace's size
        key *= span
        key += ts
        key -= lo
        return np.argsort(key, kind="stable")
    return np.lexsort((np.arange(len(track)), ts, track))


def nest_complete(
    track: np.ndarray, ts: np.ndarray, dur: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent index of complete slices (parent -1 at the top of a track)."""
    n = len(ts)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx = np.arange(n, dtype=np.int64)
    end = ts + dur
    zero = dur <= 0
    # Ends come before begins at the same time, except the end of an empty slice,
    # which follows every begin at its time so the slice nests where it starts.
    kind = np.r_[np.ones(n, np.int8), np.where(zero, 2, 0).astype(np.int8)]
    time = np.r_[ts, end]
    tie = np.r_[-dur, -ts]  # longer begins first; later-begun ends first
    trk = np.r_[track, track]
    who_key = np.r_[idx, -idx]  # equal begins keep file order; their ends reverse it
    order = np.lexsort((who_key, tie, kind, time, trk))
    del who_key, tie, kind, time, end  # the sort keys: a large trace holds 2n of each
    is_begin = np.r_[np.ones(n, bool), np.zeros(n, bool)][order]
    delta = np.where(is_begin, 1, -1)
    del is_begin
    depth_after = _running_depth(trk[order], delta)
    del trk, delta
    pos = np.empty(2 * n, np.int64)
    pos[order] = np.arange(2 * n)
    begin_pos = pos[:n]
    depth = depth_after[begin_pos] - 1
    depth = np.maximum(depth, 0)
    parent = _parents(begin_pos, depth)
    return depth.astype(np.int64), parent


def match_begin_end(
    track: np.ndarray, is_begin: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pair begin and end events, taken per track in time order (file order at equal times,
    as Perfetto sorts them).

    Returns (begin_index, end_index or -1 when never closed, depth, parent begin
    position in the begin list or -1); ends closing nothing are dropped.
    """
    order = track_time_order(track, ts)
    trk = track[order]
    beg = is_begin[order]
    depth_after = _running_depth(trk, _steps(beg))
    # An end that would take a track below zero closes nothing: drop it.
    if ((~beg) & (depth_after < 0)).any():
        keep = ~_stray_ends(trk, beg, depth_after)
        order, trk, beg = order[keep], trk[keep], beg[keep]
        depth_after = _running_depth(trk, _steps(beg))
    del trk  # a large trace's arrays: each one dropped once used
    b_pos = np.flatnonzero(beg)  # positions in the sorted stream
    b_depth = depth_after[b_pos] - 1
    e_pos = np.flatnonzero(~beg)
    del beg
    e_depth = depth_after[e_pos]  # an end at depth d closes the latest begin at depth d
    del depth_after
    end_of = np.full(len(b_pos), -1, np.int64)
    levels = _present(e_depth)
    if len(levels) > FEW_DEPTHS:
        j = _latest_at_depth(b_depth, b_pos, e_depth, e_pos)
        ok = j >= 0
        end_of[j[ok]] = order[e_pos[ok]]
    for d in levels if len(levels) <= FEW_DEPTHS else ():
        bi = np.flatnonzero(b_depth == d)
        ei = np.flatnonzero(e_depth == d)
        j = np.searchsorted(b_pos[bi], e_pos[ei]) - 1
        ok = j >= 0
        end_of[bi[j[ok]]] = order[e_pos[ei[ok]]]
    del e_pos, e_depth
    parent = _parents(b_pos, b_depth)
    return order[b_pos], end_of, b_depth, parent


def _steps(is_begin: np.ndarray) -> np.ndarray:
    """+1 for a begin, -1 for an end (one byte each)."""
    return np.where(is_begin, np.int8(1), np.int8(-1))


def _stray_ends(track: np.ndarray, is_begin: np.ndarray, depth_after: np.ndarray) -> np.ndarray:
    """Ends that close nothing, all at once: an end is stray when the depth, kept from going
    below zero, is zero before it. That kept depth is the running depth less its running
    minimum (floored at zero), taken per track."""
    n = len(track)
    first = np.r_[True, track[1:] != track[:-1]]
    rank = np.cumsum(first) - 1
    big = np.int64(2 * n + 2)  # past the range of any running depth
    # each track's values sit below every earlier track's, so one running minimum serves all
    low = np.minimum.accumulate(depth_after - rank * big) + rank * big
    kept = depth_after - np.minimum(low, 0)
    before = np.r_[0, kept[:-1]]
    before[first] = 0
    return (~is_begin) & (before == 0)


def bind_flow_points(
    slices: pd.DataFrame, track: np.ndarray, ts: np.ndarray, enclosing: np.ndarray,
    parent_of: np.ndarray | None = None, begin_ts: np.ndarray | None = None,
    begin_end: np.ndarray | None = None,
) -> np.ndarray:
    """Slice id each point binds to: the deepest slice enclosing it, or the next one.

    `slices` may be a subset of the slices; `parent_of`, `begin_ts`, `begin_end` (indexed
    by id) then describe all of them (default: taken from `slices`, ids = rows).
    """
    if not len(slices) or not len(track):
        return np.full(len(track), -1, np.int64)
    order = np.lexsort((slices["depth"].to_numpy(), slices["ts"].to_numpy(),
                        slices["track_id"].to_numpy()))
    s_track = slices["track_id"].to_numpy()[order]
    s_ts = slices["ts"].to_numpy()[order]
    s_end = s_ts + np.maximum(slices["dur"].to_numpy()[order], 0)
    s_id = slices["id"].to_numpy()[order]
    if parent_of is None:
        parent_of = slices["parent_id"].to_numpy()
        begin_ts = slices["ts"].to_numpy()
        begin_end = begin_ts + np.maximum(slices["dur"].to_numpy(), 0)
    assert begin_ts is not None and begin_end is not None
    # Search within each track: offset times by track so blocks never interleave.
    span = int(max(s_end.max(), ts.max()) - min(s_ts.min(), ts.min()) + 2)
    base = min(int(s_ts.min()), int(ts.min()))
    skey = s_track * span + (s_ts - base)
    qkey = track * span + (ts - base)
    right = np.searchsorted(skey, qkey, side="right") - 1
    left = np.searchsorted(skey, qkey, side="left")
    out = np.full(len(track), -1, np.int64)
    # enclosing: the latest slice starting at or before ts, or an ancestor holding ts
    cand = np.where(right >= 0, right, 0)
    ok = (right >= 0) & (s_track[cand] == track)
    found = np.where(ok, s_id[cand], -1)
    for _ in range(64):
        live = found >= 0
        f = np.where(live, found, 0)
        inside = live & (begin_ts[f] <= ts) & ((ts < begin_end[f]) | (begin_ts[f] == ts))
        climb = live & ~inside
        if not climb.any():
            break
        found = np.where(climb, parent_of[f], found)
    out[enclosing] = found[enclosing]
    # next slice: first starting at or after ts on the same track
    nxt = np.minimum(left, len(skey) - 1)
    ok_next = (left < len(skey)) & (s_track[nxt] == track)
    out[~enclosing] = np.where(ok_next, s_id[nxt], -1)[~enclosing]
    return out
