"""Window queries over a trace's slices with level of detail, like the Perfetto UI.

The index is built once per trace: one row per (track, depth) holding sorted numpy
arrays, and one row per counter track. A query for a time window returns only
what is visible; slices narrower than a pixel bucket are merged into summary bars
so the answer stays a few thousand items whatever the trace size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf

# Order of track kinds from top to bottom: host first, then each device.
KIND_ORDER = {"thread": 0, "gpu_stream": 1, "kernels": 2, "engine": 3, "dma": 4, "counter": 6}
ENGINE_ORDER = tf.ENGINES
MAX_DEPTH_ROWS = 12  # deeper host nesting is folded into the last row
SUMMARY_ID = -1  # id given to merged bars


@dataclass
class SliceRow:
    """The slices of one track at one nesting depth, sorted by start time."""

    label: str  # the track's name
    track_id: int
    kind: str
    depth: int
    ts: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    end_max: np.ndarray  # running max of end: lets searchsorted skip finished slices
    ids: np.ndarray  # int64 slice ids
    names: np.ndarray  # object, slice names
    categories: np.ndarray  # object, slice categories
    lower_names: np.ndarray | None = None  # names in lower case, built by the first search


@dataclass
class CounterRow:
    """One counter track: values over time."""

    label: str
    track_id: int
    ts: np.ndarray
    values: np.ndarray
    vmax: float


@dataclass
class WindowRows:
    """What a window query returns: flat arrays over all visible bars and counter points."""

    t0: int
    t1: int
    bucket_ns: float
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    row: np.ndarray  # int32 row index (slice rows, then counter rows)
    ids: np.ndarray  # int64 slice id, SUMMARY_ID for merged bars
    count: np.ndarray  # int64 slices behind each bar (1 for a real slice)
    names: list[str]
    categories: list[str]
    counters: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def n_bars(self) -> int:
        return int(self.start.size)


class TimelineIndex:
    """Per-track, per-depth sorted arrays of a trace's slices, answering window queries."""

    def __init__(self, slices: pd.DataFrame, tracks: pd.DataFrame, counters: pd.DataFrame,
                 fold_dma: bool = True) -> None:
        self.slice_rows: list[SliceRow] = []
        self.counter_rows: list[CounterRow] = []
        self.folded_dma_queues = 0  # DMA queue tracks drawn as one row per device
        self._searches: dict[str, np.ndarray] = {}
        # The metadata instant sits at the recording's start, which can be long before the
        # first recorded step (--steps A:B): it would stretch the whole-trace view.
        drawn = slices
        if "category" in slices.columns and len(slices):
            drawn = slices[slices["category"].to_numpy() != "metadata"]
        self._build_slice_rows(drawn, tracks, fold_dma)
        self._build_counter_rows(counters, tracks)
        self._build_lookup(slices)  # positions into the whole slices table
        starts = [r.ts[0] for r in self.slice_rows if r.ts.size] + [
            r.ts[0] for r in self.counter_rows if r.ts.size
        ]
        ends = [r.end_max[-1] for r in self.slice_rows if r.ts.size] + [
            r.ts[-1] for r in self.counter_rows if r.ts.size
        ]
        self.start_ns = int(min(starts)) if starts else 0
        self.end_ns = int(max(ends)) if ends else 1
        if self.end_ns <= self.start_ns:
            self.end_ns = self.start_ns + 1

    # -- building ---------------------------------------------------------------
    def _build_slice_rows(self, slices: pd.DataFrame, tracks: pd.DataFrame, fold_dma: bool) -> None:
        if slices is None or slices.empty:
            return
        track_id = slices["track_id"].to_numpy(dtype=np.int64)
        depth = np.minimum(slices["depth"].to_numpy(dtype=np.int64), MAX_DEPTH_ROWS - 1)
        folded = _dma_groups(tracks) if fold_dma else {}
        if folded:
            # A device has up to 256 DMA queues: one row per device keeps the timeline readable.
            group = pd.Series(track_id).map({t: g for g, members in folded.items()
                                             for t in members})
            in_group = group.notna().to_numpy()
            track_id = np.where(in_group, group.fillna(-1).to_numpy(dtype=np.int64), track_id)
            depth = np.where(in_group, 0, depth)
            self.folded_dma_queues = sum(len(m) for m in folded.values())
        ts = slices["ts"].to_numpy(dtype=np.int64)
        end = ts + slices["dur"].to_numpy(dtype=np.int64).clip(min=0)
        ids = slices["id"].to_numpy(dtype=np.int64)
        names = slices["name"].to_numpy(dtype=object)
        categories = slices["category"].to_numpy(dtype=object)
        order = np.lexsort((ts, depth, track_id))
        track_id, depth, ts, end = track_id[order], depth[order], ts[order], end[order]
        ids, names, categories = ids[order], names[order], categories[order]
        keys = track_id * MAX_DEPTH_ROWS + depth
        bounds = np.flatnonzero(np.diff(keys)) + 1
        starts = np.concatenate([[0], bounds])
        stops = np.concatenate([bounds, [keys.size]])
        info = _track_info(tracks)
        # DataLoader workers' tracks go below the program's own threads
        worker_tracks = set(track_id[categories == tf.CAT_DATALOADER_WORKER].tolist())
        groups = []
        for a, b in zip(starts, stops, strict=True):
            tid, d = int(track_id[a]), int(depth[a])
            name, kind, process, device = info.get(tid, (f"track {tid}", "thread", "", -1))
            sort_key = (device, KIND_ORDER.get(kind, 5), tid in worker_tracks, process,
                        _engine_rank(name), _natural(name), tid, d)
            label = name
            if tid in folded:
                label = f"DMA ({len(folded[tid])} queues)"
            row = SliceRow(
                label=label, track_id=tid, kind=kind, depth=d, ts=ts[a:b], end=end[a:b],
                end_max=np.maximum.accumulate(end[a:b]), ids=ids[a:b],
                names=names[a:b], categories=categories[a:b],
            )
            groups.append((sort_key, row))
        groups.sort(key=lambda g: g[0])
        self.slice_rows = [row for _, row in groups]

    def _build_counter_rows(self, counters: pd.DataFrame, tracks: pd.DataFrame) -> None:
        if counters is None or counters.empty:
            return
        info = _track_info(tracks)
        rows = []
        for tid, group in counters.groupby("track_id", sort=True):
            group = group.sort_values("ts", kind="stable")
            values = group["value"].to_numpy(dtype=np.float64)
            name = str(group["name"].iloc[0]) if "name" in group else info.get(tid, ("",))[0]
            device = info.get(int(tid), ("", "counter", "", -1))[3]
            vmax = float(np.nanmax(np.abs(values))) if values.size else 0.0
            rows.append(((device, name), CounterRow(
                label=name, track_id=int(tid), ts=group["ts"].to_numpy(dtype=np.int64),
                values=values, vmax=vmax if vmax > 0 else 1.0,
            )))
        rows.sort(key=lambda r: r[0])
        self.counter_rows = [r for _, r in rows]

    def _build_lookup(self, slices: pd.DataFrame) -> None:
        """Slice id -> (row, position in the slices table) for selection and details."""
        n = sum(r.ids.size for r in self.slice_rows)
        ids = np.empty(n, dtype=np.int64)
        rows = np.empty(n, dtype=np.int32)
        pos = 0
        for i, r in enumerate(self.slice_rows):
            ids[pos:pos + r.ids.size] = r.ids
            rows[pos:pos + r.ids.size] = i
            pos += r.ids.size
        order = np.argsort(ids, kind="stable")
        self._sorted_ids, self._id_rows = ids[order], rows[order]
        if slices is not None and not slices.empty:
            table_ids = slices["id"].to_numpy(dtype=np.int64)
            self._table_order = np.argsort(table_ids, kind="stable")
            self._table_ids = table_ids[self._table_order]
        else:
            self._table_order = self._table_ids = np.empty(0, dtype=np.int64)

    # -- lookups ----------------------------------------------------------------
    @property
    def labels(self) -> list[str]:
        """Row names for the axis: a track's name on its first row; nested rows say what they hold
        (`↳ module`, `↳ op`), so a deep host stack reads without hovering."""
        return ([_short(r.label) if r.depth == 0 else "↳ " + _contents(r.categories)
                 for r in self.slice_rows]
                + [_short(r.label) for r in self.counter_rows])

    @property
    def categories(self) -> list[str]:
        """Every slice category drawn, in order of first appearance from the top row down."""
        seen: dict[str, None] = {}
        for r in self.slice_rows:
            for category in pd.unique(r.categories):
                seen.setdefault(str(category), None)
        return list(seen)

    def search(self, text: str) -> np.ndarray:
        """Ids of the slices whose name contains `text` (any case), in order of start time."""
        needle = text.strip().lower()
        if not needle:
            return np.empty(0, dtype=np.int64)
        if needle in self._searches:
            return self._searches[needle]
        found_ts, found_ids = [], []
        for r in self.slice_rows:
            names = self._lower_names(r)
            matches = pd.Series(names, copy=False).str.contains(needle, regex=False)
            hit = np.flatnonzero(matches.to_numpy())
            found_ts.append(r.ts[hit])
            found_ids.append(r.ids[hit])
        ts, ids = np.concatenate(found_ts), np.concatenate(found_ids)
        found = ids[np.argsort(ts, kind="stable")]
        if len(self._searches) >= 16:  # Next/Previous ask again: keep the last few answers
            self._searches.pop(next(iter(self._searches)))
        self._searches[needle] = found
        return found

    def _lower_names(self, row: SliceRow) -> np.ndarray:
        """A row's names in lower case, computed once (most rows repeat a few names many times)."""
        if row.lower_names is None:
            uniques, inverse = np.unique(row.names.astype(str), return_inverse=True)
            row.lower_names = np.char.lower(uniques.astype(str))[inverse].astype(object)
        return row.lower_names

    def slice_span(self, slice_id: int) -> tuple[int, int] | None:
        """(start, end) in ns of a drawn slice, or None."""
        row = self.row_of(slice_id)
        if row is None:
            return None
        r = self.slice_rows[row]
        i = int(np.flatnonzero(r.ids == slice_id)[0])
        return int(r.ts[i]), int(r.end[i])

    @property
    def n_events(self) -> int:
        return int(sum(r.ids.size for r in self.slice_rows)
                   + sum(r.ts.size for r in self.counter_rows))

    def row_of(self, slice_id: int) -> int | None:
        """The timeline row a slice is drawn in, or None for an unknown id."""
        if not _is_int64(slice_id):
            return None
        i = int(np.searchsorted(self._sorted_ids, slice_id))
        if i < self._sorted_ids.size and self._sorted_ids[i] == slice_id:
            return int(self._id_rows[i])
        return None

    def table_position(self, slice_id: int) -> int | None:
        """Position of a slice in the trace's `slices` table (for its details)."""
        if not _is_int64(slice_id):
            return None
        i = int(np.searchsorted(self._table_ids, slice_id))
        if i < self._table_ids.size and self._table_ids[i] == slice_id:
            return int(self._table_order[i])
        return None

    # -- queries ----------------------------------------------------------------
    def query(self, t0: int, t1: int, width_px: int = 1600) -> WindowRows:
        """Bars and counter points visible in [t0, t1], merged to at most ~1 per pixel."""
        t0, t1 = int(t0), int(t1)
        if t1 <= t0:
            t1 = t0 + 1
        bucket = max((t1 - t0) / max(int(width_px), 1), 1.0)
        parts = [self._query_row(i, r, t0, t1, bucket) for i, r in enumerate(self.slice_rows)]
        parts = [p for p in parts if p is not None]
        if parts:
            start, end, row, ids, count = (np.concatenate([p[k] for p in parts]) for k in range(5))
            names = [n for p in parts for n in p[5]]
            cats = [c for p in parts for c in p[6]]
        else:
            start = end = ids = count = np.empty(0, dtype=np.int64)
            row = np.empty(0, dtype=np.int32)
            names, cats = [], []
        counters = []
        base = len(self.slice_rows)
        for j, c in enumerate(self.counter_rows):
            points = _counter_window(c, t0, t1, bucket)
            if points is not None:
                counters.append((base + j, points[0], points[1]))
        return WindowRows(t0, t1, bucket, start, end, row, ids, count, names, cats, counters)

    @staticmethod
    def _query_row(index: int, r: SliceRow, t0: int, t1: int, bucket: float):
        lo = int(np.searchsorted(r.end_max, t0, side="right"))
        hi = int(np.searchsorted(r.ts, t1, side="left"))
        if hi <= lo:
            return None
        ts, end = r.ts[lo:hi], r.end[lo:hi]
        visible = end >= t0  # a long slice earlier in the row may hide shorter finished ones
        sel = np.flatnonzero(visible)
        if sel.size == 0:
            return None
        big = (end[sel] - ts[sel]) >= bucket
        big_idx = sel[big]
        small_idx = sel[~big]
        out_start = [ts[big_idx]]
        out_end = [end[big_idx]]
        out_ids = [r.ids[lo:hi][big_idx]]
        out_count = [np.ones(big_idx.size, dtype=np.int64)]
        names = list(r.names[lo:hi][big_idx])
        cats = list(r.categories[lo:hi][big_idx])
        if small_idx.size:
            # Runs of small slices in adjacent pixel buckets with no big slice between
            # them become one summary bar.
            buckets = ((ts[small_idx] - t0) // bucket).astype(np.int64)
            brk = (np.diff(buckets) > 1) | (np.diff(small_idx) > 1)
            run_starts = np.concatenate([[0], np.flatnonzero(brk) + 1])
            counts = np.diff(np.concatenate([run_starts, [small_idx.size]]))
            s = ts[small_idx][run_starts]
            e = np.maximum.reduceat(end[small_idx], run_starts)
            single = counts == 1
            first = small_idx[run_starts]
            run_ids = np.where(single, r.ids[lo:hi][first], SUMMARY_ID)
            out_start.append(s)
            out_end.append(e)
            out_ids.append(run_ids)
            out_count.append(counts.astype(np.int64))
            first_names = r.names[lo:hi][first]
            first_cats = r.categories[lo:hi][first]
            names += [n if one else f"{k:,} slices"
                      for n, one, k in zip(first_names, single, counts, strict=True)]
            cats += [c if one else "merged" for c, one in zip(first_cats, single, strict=True)]
        start = np.concatenate(out_start)
        return (
            start, np.concatenate(out_end), np.full(start.size, index, dtype=np.int32),
            np.concatenate(out_ids), np.concatenate(out_count), names, cats,
        )


def _counter_window(c: CounterRow, t0: int, t1: int, bucket: float):
    """Counter samples in the window, reduced to the max per pixel bucket."""
    lo = max(int(np.searchsorted(c.ts, t0, side="right")) - 1, 0)
    hi = int(np.searchsorted(c.ts, t1, side="right"))
    if hi <= lo:
        return None
    ts, values = c.ts[lo:hi], c.values[lo:hi]
    if ts.size > (t1 - t0) / bucket:
        buckets = ((np.maximum(ts, t0) - t0) // bucket).astype(np.int64)
        starts = np.concatenate([[0], np.flatnonzero(np.diff(buckets)) + 1])
        ts = np.maximum(ts[starts], t0)
        values = np.maximum.reduceat(values, starts)
    return ts, values


def _short(label: str, limit: int = 30) -> str:
    """Long thread names keep their start and end: 'thread 3100453 (launc…test_m)'."""
    if len(label) <= limit:
        return label
    head = limit * 2 // 3
    return label[:head] + "…" + label[-(limit - head - 1):]


def _dma_groups(tracks: pd.DataFrame) -> dict[int, list[int]]:
    """First DMA track of each process -> all its DMA tracks, for processes with several."""
    if tracks is None or tracks.empty or "kind" not in tracks.columns:
        return {}
    dma = tracks[tracks["kind"] == "dma"]
    groups = {}
    for _, g in dma.groupby("process", sort=False):
        members = sorted(int(t) for t in g["track_id"])
        if len(members) > 1:
            groups[members[0]] = members
    return groups


def _natural(text: str) -> tuple:
    """Sort key that puts "DMA q2" before "DMA q10"."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", text))


def _engine_rank(track_name: str) -> int:
    """Engines in the order of the hardware guides rather than alphabetically."""
    lower = track_name.lower()
    for rank, engine in enumerate(ENGINE_ORDER):
        if lower.startswith(engine):
            return rank
    return len(ENGINE_ORDER)


def _track_info(tracks: pd.DataFrame) -> dict[int, tuple[str, str, str, int]]:
    """track_id -> (name, kind, process, device)."""
    if tracks is None or tracks.empty:
        return {}
    info = {}
    for row in tracks.itertuples(index=False):
        device = getattr(row, "device", -1)
        device = -1 if device is None or pd.isna(device) else int(device)
        info[int(row.track_id)] = (
            str(row.name), str(getattr(row, "kind", "thread")),
            str(getattr(row, "process", "")), device,
        )
    return info


def _is_int64(value: int) -> bool:
    """Whether an id from the browser can be one of the trace's (int64) ids."""
    return -(2**63) <= value < 2**63


def _contents(categories: np.ndarray) -> str:
    """What a nested row holds: its most common category, and a second one if it is common too."""
    values, counts = np.unique(categories.astype(str), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    names = [str(values[order[0]])]
    if len(order) > 1 and counts[order[1]] >= 0.2 * counts[order[0]]:
        names.append(str(values[order[1]]))
    return " · ".join(names)
