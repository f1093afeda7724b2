"""What every loader produces: columnar slices, counters, flows and tracks.

A loader collects events into plain columns; `build_slices` nests them, orders
them by time and gives each slice its id (its row). `Trace` wraps the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.loaders.args import SliceArgs, categorical, categorical_of
from neuron_explorer.loaders.nesting import nest_complete

SLICE_COLUMNS = ["id", "ts", "dur", "name", "category", "kind", "track_id", "depth", "parent_id"]
TRACK_COLUMNS = ["track_id", "name", "kind", "process", "pid", "tid", "device"]
COUNTER_COLUMNS = ["ts", "value", "track_id", "name"]
FLOW_COLUMNS = ["flow_id", "src_id", "dst_id"]


@dataclass
class RawTrace:
    """A loaded trace before derived tables: the loader's whole output."""

    path: str
    source_format: str  # "pftrace" | "chrome_json" | "kineto_json"
    slices: pd.DataFrame  # SLICE_COLUMNS, id == row
    args: SliceArgs  # per slice id: dict or None
    tracks: pd.DataFrame
    counters: pd.DataFrame
    flows: pd.DataFrame | Callable[[], pd.DataFrame]  # or what builds them on first use
    metadata: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# a text column: strings, or codes into a list of distinct strings (cheaper to build)
Texts = np.ndarray | tuple[np.ndarray, list[str]]


def _texts(column: Texts, order: np.ndarray) -> pd.Categorical:
    """A text column of the slices: categorical (a few distinct names, categories, kinds
    over many rows: a code per row, and the trace cache's Parquet dictionaries read back
    as they are)."""
    if isinstance(column, tuple):
        codes, values = column
        return categorical(np.asarray(codes)[order], values)
    return categorical_of(np.asarray(column, object)[order])


def build_slices(
    track_id: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    name: Texts,
    category: Texts,
    kind: Texts,
    depth: np.ndarray | None = None,
    parent: np.ndarray | None = None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Slices sorted by (ts, depth) with ids = rows; returns the frame and the permutation.

    `parent` holds input positions (-1: none); when depth/parent are not given they
    are computed from the intervals.
    """
    track_id = np.asarray(track_id, np.int64)
    ts = np.asarray(ts, np.int64)
    dur = np.asarray(dur, np.int64)
    if depth is None or parent is None:
        depth, parent = nest_complete(track_id, ts, dur)
    order = ts_track_depth_order(ts, track_id, np.asarray(depth, np.int64))
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    parent = np.asarray(parent, np.int64)[order]
    parent_id = np.where(parent >= 0, new_id[np.maximum(parent, 0)], -1)
    frame = pd.DataFrame(
        {
            "id": np.arange(len(order), dtype=np.int64),
            "ts": ts[order],
            "dur": dur[order],
            "name": _texts(name, order),
            "category": _texts(category, order),
            "kind": _texts(kind, order),
            "track_id": track_id[order],
            "depth": np.asarray(depth, np.int64)[order],
            "parent_id": parent_id,
        },
        copy=False,  # fresh columns: no copy into one consolidated block
    )
    return frame, order


def ts_track_depth_order(ts: np.ndarray, track_id: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Indices sorted by (ts, track, depth), input order kept at equal keys."""
    if not len(ts):
        return np.zeros(0, np.int64)
    ts_lo, track_lo, depth_lo = int(ts.min()), int(track_id.min()), int(depth.min())
    n_tracks = int(track_id.max()) - track_lo + 1
    n_depths = int(depth.max()) - depth_lo + 1
    if (int(ts.max()) - ts_lo + 1) * n_tracks * n_depths < 1 << 62:
        # one int64 key: a single stable sort, much faster than a three-key lexsort
        key = ((ts - ts_lo) * n_tracks + (track_id - track_lo)) * n_depths + (depth - depth_lo)
        return np.argsort(key, kind="stable")
    return np.lexsort((depth, track_id, ts))

