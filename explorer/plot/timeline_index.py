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
from neuron_explorer.loaders.args import compact

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
    ids: np.ndarray  # slice ids (int32 where every id fits)
    # names and categories as codes into the index's distinct values (object arrays whose
    # last value, None, is what code -1 reads): a string per slice took 2.4 GB of 20 M
    name_codes: np.ndarray
    category_codes: np.ndarray
    name_values: np.ndarray
    category_values: np.ndarray

    def names_at(self, at: slice | np.ndarray) -> np.ndarray:
        """The names of the slices at these positions of the row (an object array)."""
        return self.name_values[self.name_codes[at]]

    def categories_at(self, at: slice | np.ndarray) -> np.ndarray:
        """The categories of the slices at these positions of the row (an object array)."""
        return self.category_values[self.category_codes[at]]


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
        drawn = None  # a mask, not a filtered copy of every column (1 GB at 20 M slices)
        if "category" in slices.columns and len(slices):
            drawn = np.asarray(slices["category"] != "metadata", bool)
        self._build_slice_rows(slices, tracks, fold_dma, drawn)
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
    def _build_slice_rows(self, slices: pd.DataFrame, tracks: pd.DataFrame, fold_dma: bool,
                          drawn: np.ndarray | None) -> None:
        if slices is None or slices.empty or (drawn is not None and not drawn.any()):
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
        dur = slices["dur"].to_numpy(dtype=np.int64)
        ids = compact(slices["id"].to_numpy(dtype=np.int64))  # int32 where they fit
        name_codes, name_values = _codes(slices["name"])
        category_codes, category_values = _codes(slices["category"])
        # rows by (track, depth), each in time order: the slices come in time order as a
        # rule, so a stable sort by one small key, and each row's columns gathered alone
        # (sorted copies of every column at once peaked 1.5 GB above the index at 20 M)
        keys = _ranks(track_id) * MAX_DEPTH_ROWS + depth
        if keys.size and keys.max() < np.iinfo(np.int16).max:
            keys = keys.astype(np.int16)  # numpy sorts 16-bit keys by radix: one pass
        if drawn is None or drawn.all():
            order = np.argsort(keys, kind="stable")
        else:
            order = np.flatnonzero(drawn)
            order = order[np.argsort(keys[order], kind="stable")]
        keys = keys[order]
        bounds = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        starts = np.concatenate([[0], bounds])
        stops = np.concatenate([bounds, [keys.size]])
        del keys
        info = _track_info(tracks)
        # DataLoader workers' tracks go below the program's own threads
        worker_code = _code_of(category_values, tf.CAT_DATALOADER_WORKER)
        worker_tracks = set(track_id[order[category_codes[order] == worker_code]].tolist())
        groups = []
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            at = order[a:b]
            row_ts = ts[at]
            if len(row_ts) > 1 and (row_ts[1:] < row_ts[:-1]).any():
                at = at[np.argsort(row_ts, kind="stable")]
                row_ts = ts[at]
            tid, d = int(track_id[at[0]]), int(depth[at[0]])
            name, kind, process, device = info.get(tid, (f"track {tid}", "thread", "", -1))
            sort_key = (device, KIND_ORDER.get(kind, 5), tid in worker_tracks, process,
                        _engine_rank(name), _natural(name), tid, d)
            label = name
            if tid in folded:
                label = f"DMA ({len(folded[tid])} queues)"
            row_end = row_ts + dur[at].clip(min=0)
            row = SliceRow(
                label=label, track_id=tid, kind=kind, depth=d, ts=row_ts, end=row_end,
                end_max=np.maximum.accumulate(row_end), ids=ids[at],
                name_codes=name_codes[at], category_codes=category_codes[at],
                name_values=name_values, category_values=category_values,
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
        ids = np.empty(n, dtype=self.slice_rows[0].ids.dtype if self.slice_rows else np.int64)
        rows = np.empty(n, dtype=np.int32)
        pos = 0
        for i, r in enumerate(self.slice_rows):
            ids[pos:pos + r.ids.size] = r.ids
            rows[pos:pos + r.ids.size] = i
            pos += r.ids.size
        order = np.argsort(ids, kind="stable")
        self._sorted_ids, self._id_rows = ids[order], rows[order]
        self._table_order: np.ndarray | None = None  # None: the table is in id order
        self._table_ids = np.empty(0, dtype=np.int64)
        if slices is not None and not slices.empty:
            table_ids = slices["id"].to_numpy(dtype=np.int64)
            if len(table_ids) > 1 and (table_ids[1:] <= table_ids[:-1]).any():
                self._table_order = np.argsort(table_ids, kind="stable")
                table_ids = table_ids[self._table_order]
            self._table_ids = table_ids  # as a rule the table's own column: no copy

    # -- lookups ----------------------------------------------------------------
    @property
    def labels(self) -> list[str]:
        """Row names for the axis: a track's name on its first row; nested rows say what they hold
        (`↳ module`, `↳ op`), so a deep host stack reads without hovering."""
        return ([_short(r.label) if r.depth == 0 else "↳ " + _contents(r)
                 for r in self.slice_rows]
                + [_short(r.label) for r in self.counter_rows])

    @property
    def categories(self) -> list[str]:
        """Every slice category drawn, in order of first appearance from the top row down."""
        seen: dict[str, None] = {}
        for r in self.slice_rows:
            for category in r.category_values[pd.unique(r.category_codes)]:
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
            # the distinct names matched once; a row's slices by their codes
            lower = pd.Series([str(v).lower() for v in r.name_values], dtype=object)
            matched = np.flatnonzero(lower.str.contains(needle, regex=False).to_numpy())
            codes = np.where(r.name_codes >= 0, r.name_codes, len(r.name_values) - 1)
            hit = np.flatnonzero(np.isin(codes, matched))
            found_ts.append(r.ts[hit])
            found_ids.append(r.ids[hit])
        ts, ids = np.concatenate(found_ts), np.concatenate(found_ids)
        found = ids[np.argsort(ts, kind="stable")]
        if len(self._searches) >= 16:  # Next/Previous ask again: keep the last few answers
            self._searches.pop(next(iter(self._searches)))
        self._searches[needle] = found
        return found

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
            return i if self._table_order is None else int(self._table_order[i])
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
        names = list(r.names_at(lo + big_idx))
        cats = list(r.categories_at(lo + big_idx))
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
            first_names = r.names_at(lo + first)
            first_cats = r.categories_at(lo + first)
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


def _ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank among the distinct values (int64), by a lookup table where the
    values are small non-negative ids (tracks'): numpy's unique hashes every value."""
    if values.size and values.min() >= 0 and values.max() < 1 << 24:
        present = np.zeros(int(values.max()) + 1, bool)
        present[values] = True
        return (np.cumsum(present) - 1)[values]
    return np.unique(values, return_inverse=True)[1].astype(np.int64)


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A text column as (codes, -1 where missing; its distinct values then None)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, distinct = column.cat.codes.to_numpy(), column.cat.categories
    else:
        codes, distinct = pd.factorize(column.to_numpy(dtype=object))
    values = np.empty(len(distinct) + 1, object)
    values[:-1] = [str(v) for v in distinct]
    return codes, values


def _code_of(values: np.ndarray, text: str) -> int:
    """The code of `text` among `_codes`' values (-2, which no row has, where absent)."""
    found = np.flatnonzero(values[:-1] == text)
    return int(found[0]) if len(found) else -2


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


def _contents(row: SliceRow) -> str:
    """What a nested row holds: its most common category, and a second one if it is common too
    (equal counts: in lexical order)."""
    codes = np.where(row.category_codes >= 0, row.category_codes, len(row.category_values) - 1)
    counts: dict[str, int] = {}
    for value, n in zip(row.category_values.tolist(),
                        np.bincount(codes, minlength=len(row.category_values)).tolist(),
                        strict=True):
        if n:
            counts[str(value)] = counts.get(str(value), 0) + n
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    names = [ranked[0][0]]
    if len(ranked) > 1 and ranked[1][1] >= 0.2 * ranked[0][1]:
        names.append(ranked[1][0])
    return " · ".join(names)
