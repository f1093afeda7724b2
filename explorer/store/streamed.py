"""A .pftrace's cache entry built as the trace is decoded, a window at a time.

`loaders/pftrace_stream.py` leaves the begins and ends, the instants and the decoded args
(keyed by event) on disk; here the begins and ends are paired, the slices numbered as
every loader numbers them (by time, track and depth) and their frame built a column at a
time, and the args rewritten with slice ids a row group at a time. The load never holds
the file, every event's columns or every arg at once: 10 M slices (583 MiB) first load
with 1.2 GB above the imports, where the whole read took 3.6 GB.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.errors import TraceFormatWarning, TruncatedTraceWarning
from neuron_explorer.loaders.args import ColumnArgs, LazyArgs, SliceArgs, categorical
from neuron_explorer.loaders.kinds import our_kind
from neuron_explorer.loaders.metadata import merge_metadata, missing_end_mark
from neuron_explorer.loaders.pftrace import (
    counter_frame,
    decoded_tracks,
    flow_edges,
    nest_instants,
)
from neuron_explorer.loaders.pftrace_stream import (
    Streamed,
    pair_slices,
    say_damage,
    stream_pftrace,
)
from neuron_explorer.loaders.raw import RawTrace, ts_track_depth_order
from neuron_explorer.store.parquet import (
    Store,
    args_from_arrow,
    args_table,
    build_manifest,
    move_in_built,
    parquet_writer,
    write_parquet,
)


def write_streamed_entry(path: str, folder: str, source: dict[str, Any],
                         caught: list[warnings.WarningMessage],
                         reparse: Callable[[], RawTrace]) -> tuple[RawTrace, Store]:
    """Decode the .pftrace at `path` into the store at `folder` (built beside it and moved
    in place) and return its tables, the args read from the store on first use.

    `caught`: the load's warnings as they are heard (the manifest keeps them); `reparse`
    reads the trace whole, should the store's args prove unreadable later. Raises OSError
    where the entry cannot be written (the caller then reads the trace whole).
    """
    import pyarrow as pa

    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
    spill_folder = os.path.join(tmp, "spill")
    os.mkdir(spill_folder)
    build = uuid.uuid4().hex
    try:
        streamed = stream_pftrace(path, spill_folder)
        raw, rows = _finish(streamed, tmp, build)
        shutil.rmtree(spill_folder)
        heard = [(w.category.__name__, str(w.message)) for w in caught
                 if issubclass(w.category, UserWarning)]
        store = move_in_built(tmp, folder, build_manifest(build, source, raw, heard, rows))
    except pa.ArrowException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"the tables cannot be written as Parquet ({exc})") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    raw.args = store.lazy_args(len(raw.slices), reparse)
    return raw, store


def _finish(streamed: Streamed, folder: str, build: str) -> tuple[RawTrace, dict[str, int]]:
    """Number the slices, build their frame and write the store's tables into `folder`."""
    path = streamed.path
    tracks, track_of = decoded_tracks(streamed.state, np.sort(streamed.track_uuids))
    track_id = np.array([track_of[u] for u in streamed.track_uuids.tolist()], np.int64)
    slices, event_id, meta_ids = _slices(streamed, track_id)
    n_slices = len(slices)
    rows = {"slices": n_slices}
    write_parquet(os.path.join(folder, "slices.parquet"), slices, build)
    meta, rows["args"] = _write_args(streamed, event_id, meta_ids, n_slices,
                                     os.path.join(folder, "args.parquet"), build)
    dropped = streamed.corrupt_args
    metadata = merge_metadata(path, meta)
    warn, skipped = list(streamed.warnings), dict(streamed.skipped)
    unfinished = missing_end_mark(path, metadata)
    if unfinished and not any("(was the recording killed?)" in w for w in warn):
        warnings.warn(unfinished, TruncatedTraceWarning, stacklevel=4)
        warn.append(unfinished)
    say_damage(streamed)
    if dropped[0]:
        msg = (f"{path}: {dropped[0]} debug annotations (slice args) are corrupt, the first at "
               f"byte {dropped[1]}; they were left out")
        warnings.warn(msg, TraceFormatWarning, stacklevel=4)
        warn.append(msg)
        skipped["corrupt debug annotation"] = dropped[0]
    ts, value, number = streamed.counters
    counters = counter_frame(ts, value, track_id[number], tracks)
    fid, ev, ev_ts, term = streamed.flows
    flows = flow_edges(fid, ev, ev_ts, event_id[ev].astype(np.int64), term)
    for name, frame in (("tracks", tracks), ("counters", counters), ("flows", flows)):
        write_parquet(os.path.join(folder, f"{name}.parquet"), frame, build)
        rows[name] = len(frame)
    raw = RawTrace(path=path, source_format="pftrace", slices=slices, args=LazyArgs(_no_args),
                   tracks=tracks, counters=counters, flows=flows, metadata=metadata,
                   skipped=skipped, warnings=warn)
    order = ["slices", "tracks", "counters", "flows", "args"]
    return raw, {name: rows[name] for name in order}


def _no_args() -> SliceArgs:  # replaced by the store's args once it is written
    raise AssertionError("the streamed trace's args are read from its store")


def _slices(streamed: Streamed, track_id: np.ndarray
            ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The slices' frame as `load_pftrace` builds it, a column at a time from the spill (the
    slices in the order paired, then the instants: what breaks ties of time, track and
    depth), each event's slice id (-1: none) and the ids of the metadata slices."""
    spill = streamed.spill
    end_event, end_begin = pair_slices(streamed)
    _add_instants(streamed, track_id)

    def column(name: str) -> np.ndarray:
        return spill.column("slices", name)

    ts, track = column("ts"), track_id[column("track")]
    depth = column("depth").astype(np.int64)
    order = ts_track_depth_order(ts, track, depth)
    n = len(order)
    frame: dict[str, Any] = {"id": np.arange(n, dtype=np.int64), "ts": ts[order]}
    del ts
    frame["dur"] = column("dur")[order]
    codes = column("name")[order]
    frame["name"] = categorical(codes, streamed.names)
    cat = column("cat")
    codes = cat[order]
    frame["category"] = categorical(codes, streamed.cats)
    frame["kind"] = categorical(codes, [our_kind(c) for c in streamed.cats])
    del codes
    frame["track_id"], frame["depth"] = track[order], depth[order]
    del track, depth
    new_id = np.empty(n, np.int64)
    new_id[order] = np.arange(n)
    event = column("event")
    event_id = np.full(streamed.n_events, -1, np.int32 if n < 2**31 else np.int64)
    event_id[event] = new_id
    del event, new_id
    event_id[end_event] = event_id[end_begin]  # an end's args and flows are its slice's
    parent = column("parent")[order]
    frame["parent_id"] = np.where(parent >= 0, event_id[np.maximum(parent, 0)], -1
                                  ).astype(np.int64)
    del parent, order
    is_meta = np.zeros(n, bool)
    for code in [i for i, c in enumerate(streamed.cats) if c == tf.CAT_METADATA]:
        is_meta |= cat == code
    meta_ids = np.sort(event_id[column("event")[is_meta]].astype(np.int64))
    return pd.DataFrame(frame, copy=False), event_id, meta_ids


def _add_instants(streamed: Streamed, track_id: np.ndarray) -> None:
    """Append the instants to the spilled slices, each nested in the deepest slice holding
    it on its track (its parent given as that slice's begin event)."""
    spill = streamed.spill
    if not spill.rows["instants"]:
        return
    i_track = track_id[spill.column("instants", "track")]
    i_ts = spill.column("instants", "ts")
    b_event = spill.column("slices", "event")
    by_event = np.argsort(b_event, kind="stable")
    parent_event = spill.column("slices", "parent")
    at = np.searchsorted(b_event, np.maximum(parent_event, 0), sorter=by_event)
    parent = np.where(parent_event >= 0, by_event[np.minimum(at, len(b_event) - 1)], -1)
    del parent_event, at, by_event
    b_ts = spill.column("slices", "ts")
    depth = spill.column("slices", "depth").astype(np.int64)
    i_depth, i_parent = nest_instants(track_id[spill.column("slices", "track")], b_ts,
                                      spill.column("slices", "dur"), depth, parent, i_track,
                                      i_ts)
    spill.add("slices", event=spill.column("instants", "event"),
              track=spill.column("instants", "track"), ts=i_ts,
              dur=np.zeros(len(i_ts), np.int64), depth=i_depth,
              parent=np.where(i_parent >= 0, np.r_[b_event, -1][i_parent], -1),
              name=spill.column("instants", "name"), cat=spill.column("instants", "cat"))


def _write_args(streamed: Streamed, event_id: np.ndarray, meta_ids: np.ndarray,
                n_slices: int, path: str, build: str) -> tuple[list[Any], int]:
    """The args decoded by the windows, a row group at a time, into the store's args file:
    each row's event number becomes its slice's id, rows of no slice (an end that closed
    nothing) left out. Returns the metadata slices' JSON texts (by id) and the rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    meta_parts: list[ColumnArgs] = []
    written = 0
    if streamed.args_file is None:  # no args: the empty table the whole decode writes
        empty = ColumnArgs(np.zeros(0, np.int64), np.zeros(0, np.int32), [],
                           np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0, np.float64),
                           (np.zeros(0, np.int64), np.empty(0, object)), n_slices)
        write_parquet(path, args_table(empty, n_slices), build)
        return _metadata_texts(meta_parts, meta_ids, n_slices), 0
    source = pq.ParquetFile(streamed.args_file)
    tmp = f"{path}.tmp"
    try:
        with parquet_writer(tmp, source.schema_arrow, build) as writer:
            pending: list[Any] = []
            for group in range(source.num_row_groups):
                table = source.read_row_group(group)
                sid = event_id[table.column("slice_id").to_numpy()].astype(np.int64)
                table = table.set_column(0, "slice_id", pa.array(sid))
                if (sid < 0).any():
                    table = table.filter(pc.greater_equal(table.column("slice_id"), 0))
                    sid = sid[sid >= 0]
                pending.append(table)
                written += len(sid)
                if len(meta_ids):
                    at = np.flatnonzero(np.isin(sid, meta_ids))
                    if len(at):
                        meta_parts.append(args_from_arrow(table.take(at), n_slices))
                if sum(len(t) for t in pending) >= ARGS_ROWS_PER_GROUP:
                    _write_group(writer, pending)
                    pending = []
            _write_group(writer, pending)
        os.replace(tmp, path)
    finally:
        source.close()
        if os.path.exists(tmp):
            os.remove(tmp)
    return _metadata_texts(meta_parts, meta_ids, n_slices), written


# Args rows of a row group of the store's file: the windows decode a small part each, and
# a file of many small row groups, each with dictionaries of its own, read back at 10 M
# slices with 3.2 GB more than the whole read's file (unifying hundreds of dictionaries).
ARGS_ROWS_PER_GROUP = 1 << 20


def _write_group(writer: Any, parts: list[Any]) -> None:
    """The parts as one row group, their dictionaries made one (as the whole read's)."""
    import pyarrow as pa

    if parts:
        writer.write_table(pa.concat_tables(parts).unify_dictionaries().combine_chunks())


def _metadata_texts(parts: list[ColumnArgs], meta_ids: np.ndarray, n_slices: int) -> list[Any]:
    """Each metadata slice's JSON text (None where it has none), by id."""
    if not parts:
        return [None] * len(meta_ids)
    names = sorted({name for p in parts for name in p.names})
    code = {name: i for i, name in enumerate(names)}
    joined = ColumnArgs(np.concatenate([p.slice_id for p in parts]),
                        np.concatenate([np.asarray([code[n] for n in p.names],
                                                   np.int64)[p.key] for p in parts]), names,
                        np.concatenate([p.kind for p in parts]),
                        np.concatenate([p.ival for p in parts]),
                        np.concatenate([p.fval for p in parts]),
                        np.concatenate([p.sval for p in parts]), n_slices)
    return joined.column(tf.ARG_METADATA_JSON, meta_ids).tolist()
