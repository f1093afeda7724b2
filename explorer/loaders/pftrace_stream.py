"""Perfetto traces decoded a window of the file at a time, for the trace store.

`load_pftrace` holds the whole file and every event's columns at once: a first load
peaked at 6.5-7x the file's size. Here the file is read a window at a time
(`WINDOW_BYTES`, never mapped: a recorder truncating the file meanwhile would kill a
process reading a mapping): each window's packets and track events are scanned, its
debug annotations decoded, and what the trace keeps goes to disk: the begins and ends,
the instants (`SpillFolder`), the args keyed by event (a Parquet file). Only what the
windows share stays in memory: interned names, track descriptors, counters, flow ids.
`pair_slices` then pairs the begins and ends in each track's time order (file order at
equal times), a chunk at a time, as a pass over the whole trace does: recorders write a
slice's begin when it ends, after its children, so a track's events run back in time in
the file and cannot be paired as they come. `store/streamed.py` numbers the slices and
writes the store's tables.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.common import perfetto_fields as F
from neuron_explorer.common.errors import (
    DamagedTraceWarning,
    TraceFormatError,
    TruncatedTraceWarning,
)
from neuron_explorer.loaders.args import ColumnArgs
from neuron_explorer.loaders.nesting import match_begin_end, track_time_order
from neuron_explorer.loaders.pftrace import (
    DAMAGE_RETRIES,
    EVENT_REPEATED,
    EVENT_SLOTS,
    IGNORED_PACKET_FIELDS,
    PACKET_SLOTS,
    DecodeState,
    EventTexts,
    event_flow_ids,
    event_names,
    event_types,
)
from neuron_explorer.loaders.pftrace_annotations import ANNOTATIONS_PER_CHUNK, decode_chunk
from neuron_explorer.loaders.wire_scan import WireError, packet_offsets, prefer_compiled_for, scan

# Bytes of the file decoded at once: a window's scans (a slot per field of each packet and
# event, its annotations decoded) are the decode's largest transient. 1 M-slice synthetic,
# the decode's peak above the imports: 330 MiB at 16 MiB windows, 148 at 4, 82 at 1.
WINDOW_BYTES = 1 << 20


class SpillFolder:
    """Columns appended a window at a time to raw files in a folder, read back whole or
    in chunks. Raw bytes: no format to encode, the dtype is the column's."""

    def __init__(self, folder: str, columns: dict[str, dict[str, Any]]) -> None:
        self.folder = folder
        self.dtypes = {table: {name: np.dtype(t) for name, t in cols.items()}
                       for table, cols in columns.items()}
        self.rows = dict.fromkeys(columns, 0)

    def _path(self, table: str, name: str) -> str:
        return os.path.join(self.folder, f"{table}.{name}.bin")

    def add(self, table: str, **columns: np.ndarray) -> None:
        n = None
        for name, dtype in self.dtypes[table].items():
            column = np.ascontiguousarray(columns[name], dtype)
            n = len(column) if n is None else n
            assert len(column) == n, f"{table}.{name}: {len(column)} rows, not {n}"
            with open(self._path(table, name), "ab") as f:
                column.tofile(f)
        self.rows[table] += n or 0

    def column(self, table: str, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows lo:hi of a column (all by default), read into memory."""
        dtype = self.dtypes[table][name]
        hi = self.rows[table] if hi is None else hi
        if hi <= lo:
            return np.zeros(0, dtype)
        with open(self._path(table, name), "rb") as f:
            f.seek(lo * dtype.itemsize)
            return np.fromfile(f, dtype, hi - lo)


SPILLED: dict[str, dict[str, Any]] = {
    # a slice's begin or end: its event number, the stream's number for its track, time
    "edges": {"event": np.int64, "track": np.int32, "ts": np.int64, "begin": np.bool_,
              "name": np.int32, "cat": np.int32},
    "instants": {"event": np.int64, "track": np.int32, "ts": np.int64, "name": np.int32,
                 "cat": np.int32},
    # the slices paired (`pair_slices`), then the instants: parent is the parent's event
    "slices": {"event": np.int64, "track": np.int32, "ts": np.int64, "dur": np.int64,
               "depth": np.int32, "parent": np.int64, "name": np.int32, "cat": np.int32},
}
ARGS_FILE = "args_by_event.parquet"  # the args decoded, slice_id holding the event number


class _Texts:
    """Distinct texts of the whole trace, coded in the order met."""

    def __init__(self) -> None:
        self.code: dict[str, int] = {"": 0}
        self.values: list[str] = [""]

    def codes_of(self, values: list[str]) -> np.ndarray:
        out = np.empty(len(values), np.int32)
        for i, v in enumerate(values):
            c = self.code.get(v)
            if c is None:
                c = self.code[v] = len(self.values)
                self.values.append(v)
            out[i] = c
        return out


@dataclass
class Streamed:
    """What the windows leave for `store/streamed.py`: the spilled columns and the trace's
    state (interned data, descriptors), names, tracks met, counters, flow ids."""

    path: str
    spill: SpillFolder
    state: DecodeState
    names: list[str]
    cats: list[str]
    track_uuids: np.ndarray  # the stream's track number -> uuid
    n_events: int
    trace_end: int
    counters: tuple[np.ndarray, np.ndarray, np.ndarray]  # ts, value, stream track
    flows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # id, event, time, ends it
    skipped: Counter[str]
    warnings: list[str]
    damage: str  # the damage warning, said once the load has succeeded ('' when none)
    corrupt_args: tuple[int, int]  # corrupt debug annotations: count, first one's byte
    args_file: str | None  # ARGS_FILE, None when no slice has args


class _Stream:
    """The windows' decoding, and what carries from one window to the next."""

    def __init__(self, path: str, spill: SpillFolder) -> None:
        self.path, self.spill = path, spill
        self.data: Any = b""  # the window's bytes, `buf` over them, `base` their file offset
        self.buf = np.zeros(0, np.uint8)
        self.base = 0
        self.keys: dict[str, int] = {}  # the args' key names, coded in the order met
        self.corrupt, self.first_corrupt = 0, -1
        self.args_writer: Any = None
        self.state = DecodeState()
        self.skipped: Counter[str] = Counter()
        self.names, self.cats = _Texts(), _Texts()
        self.track_of: dict[int, int] = {}  # uuid -> the stream's track number
        self.generation: dict[int, int] = {}  # sequence -> incremental-state generation
        self.pair_of: dict[int, int] = {}  # (sequence << 32) + generation -> pair number
        self.n_packets = self.n_events = 0
        self.trace_end: int | None = None
        self.counters: list[tuple[np.ndarray, ...]] = []
        self.flows: list[tuple[np.ndarray, ...]] = []

    # --- one window -------------------------------------------------------------------
    def window(self, data: Any, base: int, starts: np.ndarray, ends: np.ndarray) -> None:
        """Decode the packets [starts, ends) of `data` (the file's bytes from `base`), all
        or none: a WireError (its position in `data`) leaves the stream as it was."""
        self.data, self.buf, self.base = data, np.frombuffer(data, np.uint8), base
        pk = scan(self.buf, starts, ends, PACKET_SLOTS, set(), offsets={4})
        has_event = np.flatnonzero(pk.field[4] != 0)
        ev_offset = pk.offset[4][has_event]
        es = scan(self.buf, ev_offset, ev_offset + pk.value[4][has_event].astype(np.int64),
                  EVENT_SLOTS, EVENT_REPEATED, offsets={3})
        late = np.flatnonzero(pk.value[0] >= np.uint64(1 << 63))
        if len(late):
            raise TraceFormatError(self.path, f"packet timestamp {int(pk.value[0][late[0]])} "
                                   "ns is past what 64-bit signed times hold",
                                   base + int(starts[late[0]]))
        for number, count in Counter(pk.others[~np.isin(pk.others,
                                                        list(IGNORED_PACKET_FIELDS))]
                                     .tolist()).items():
            self.skipped[f"packet field {number}"] += count
        seq = pk.value[1].astype(np.int64)
        pair = self._pairs(seq, ((pk.value[2] & np.uint64(F.SEQ_INCREMENTAL_STATE_CLEARED)) != 0)
                           | (pk.value[3] != 0))
        for i in np.flatnonzero(pk.field[5] != 0).tolist():  # in file order
            self.state.read(self.data, int(starts[i]), int(ends[i]), int(seq[i]),
                            int(self.state.pairs[pair[i]][1]))
        self._events(es, pk.value[0][has_event].astype(np.int64), seq[has_event],
                     pair[has_event])
        self.n_packets += len(starts)

    def _pairs(self, seq: np.ndarray, cleared: np.ndarray) -> np.ndarray:
        """Each packet's (sequence, generation) pair number, numbered in the order met."""
        gen = np.empty(len(seq), np.int64)
        for s in pd.unique(seq).tolist():
            idx = np.flatnonzero(seq == s)
            gen[idx] = self.generation.get(s, 0) + np.cumsum(cleared[idx])
            self.generation[s] = int(gen[idx[-1]])
        codes, uniques = pd.factorize(seq * (1 << 32) + gen)
        numbers = np.empty(len(uniques), np.int32)
        for i, combo in enumerate(np.asarray(uniques).tolist()):
            number = self.pair_of.get(combo)
            if number is None:
                number = self.pair_of[combo] = len(self.state.pairs)
                self.state.pairs.append((combo >> 32, combo & 0xFFFFFFFF))
            numbers[i] = number
        return numbers[codes]

    def _events(self, es: Any, ts: np.ndarray, seq: np.ndarray, pair: np.ndarray) -> None:
        n, first = len(ts), self.n_events
        ev_type = event_types(es.value[0], self.skipped)
        uuid = es.value[2]
        has_track = es.field[2] != 0
        if not has_track.all():
            uuid = uuid.copy()
            uuid[~has_track] = np.array([self.state.default_track.get(int(q), 0)
                                         for q in seq[~has_track].tolist()], np.uint64)
        track = self._tracks(uuid)
        texts_name, texts_cat = EventTexts(n), EventTexts(n)
        event_names(self.data, es, pair, 0, self.state, texts_name, texts_cat)
        name = self.names.codes_of(texts_name.values)[texts_name.codes]
        cat = self.cats.codes_of(texts_cat.values)[texts_cat.codes]
        if n:
            end = int(ts.max())
            self.trace_end = end if self.trace_end is None else max(self.trace_end, end)
        be = np.flatnonzero((ev_type == F.TYPE_SLICE_BEGIN) | (ev_type == F.TYPE_SLICE_END))
        self.spill.add("edges", event=be + first, track=track[be], ts=ts[be],
                       begin=ev_type[be] == F.TYPE_SLICE_BEGIN, name=name[be], cat=cat[be])
        inst = np.flatnonzero(ev_type == F.TYPE_INSTANT)
        self.spill.add("instants", event=inst + first, track=track[inst], ts=ts[inst],
                       name=name[inst], cat=cat[inst])
        ann_ev, _, length, offset = es.rows.select(F.E_DEBUG)
        of_slice = np.flatnonzero(np.isin(ev_type[ann_ev], (F.TYPE_SLICE_BEGIN,
                                                            F.TYPE_SLICE_END, F.TYPE_INSTANT)))
        self._args(ann_ev[of_slice].astype(np.int64), pair, offset[of_slice],
                   length[of_slice].astype(np.int64), first)
        fid, f_ev, term = event_flow_ids(es.rows)
        self.flows.append((fid, f_ev.astype(np.int64) + first, ts[f_ev], term))
        idx = np.flatnonzero(es.value[0] == F.TYPE_COUNTER)
        raw, double = es.value[4][idx], es.field[4][idx] == F.E_DOUBLE_COUNTER
        value = np.where(double, raw.view(np.float64), raw.view(np.int64).astype(np.float64))
        self.counters.append((ts[idx], value, track[idx]))
        self.n_events += n

    def _args(self, ev: np.ndarray, pair: np.ndarray, offset: np.ndarray,
              length: np.ndarray, first: int) -> None:
        """Decode the window's slice annotations (event `ev`) a chunk at a time into the
        args file, each row's slice_id its event's number (a slice id once numbered)."""
        for lo in range(0, len(ev), ANNOTATIONS_PER_CHUNK):
            part = slice(lo, lo + ANNOTATIONS_PER_CHUNK)
            e, o, n = ev[part], offset[part], length[part]
            m = len(e)
            codes, kind = np.empty(m, np.int32), np.empty(m, np.int8)
            ival, fval = np.empty(m, np.int64), np.empty(m, np.float64)
            scode, bad = np.empty(m, np.int64), np.zeros(m, bool)
            svalues: list[Any] = []
            decode_chunk(self.data, self.buf, e, o, n, pair, self.state, self.keys, svalues,
                          (codes, kind, ival, fval, scode, bad))
            if bad.any():
                if self.first_corrupt < 0:
                    self.first_corrupt = self.base + int(o[np.flatnonzero(bad)[0]])
                self.corrupt += int(bad.sum())
                keep = ~bad
                e, codes, kind, ival, fval, scode = (e[keep], codes[keep], kind[keep],
                                                     ival[keep], fval[keep], scode[keep])
            if not len(e):
                continue
            values = np.empty(len(svalues), object)
            for i, v in enumerate(svalues):  # one by one: a nested list must stay one value
                values[i] = v
            self._write_args(ColumnArgs(e + first, codes, list(self.keys), kind, ival, fval,
                                        (scode, values), 0))

    def _write_args(self, args: ColumnArgs) -> None:
        import pyarrow.parquet as pq
        from neuron_explorer.store.parquet import args_table

        table = args_table(args, 0)
        if self.args_writer is None:  # lz4: written once, read once, soon
            self.args_writer = pq.ParquetWriter(os.path.join(self.spill.folder, ARGS_FILE),
                                                table.schema, compression="lz4")
        self.args_writer.write_table(table)

    def _tracks(self, uuid: np.ndarray) -> np.ndarray:
        """The stream's number of each event's track (in the order tracks are met)."""
        distinct, inverse = np.unique(uuid, return_inverse=True)
        numbers = np.empty(len(distinct), np.int32)
        for i, u in enumerate(distinct.tolist()):
            numbers[i] = self.track_of.setdefault(u, len(self.track_of))
        return numbers[inverse]


def stream_pftrace(path: str, spill_folder: str) -> Streamed:
    """Decode a .pftrace a window at a time, spilling its slices and args into
    `spill_folder`. Damage and a cut end are handled as `load_pftrace` handles them."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read the file ({exc.strerror or exc}); check "
                               "its permissions") from None
    spill = SpillFolder(spill_folder, SPILLED)
    stream = _Stream(path, spill)
    try:
        size = os.fstat(f.fileno()).st_size
        if not size:
            raise TraceFormatError(path, "the file is empty (was the recording stopped "
                                   "before anything was written?)", 0)
        prefer_compiled_for(size)
        warn, damage = _windows(path, f, size, stream)
    finally:
        f.close()
        if stream.args_writer is not None:
            stream.args_writer.close()
    counters = _joined(stream.counters, 3, (np.int64, np.float64, np.int32))
    flows = _joined(stream.flows, 4, (np.int64, np.int64, np.int64, bool))
    args_file = os.path.join(spill_folder, ARGS_FILE) if stream.args_writer else None
    return Streamed(path, spill, stream.state, stream.names.values, stream.cats.values,
                    np.array(list(stream.track_of), np.uint64), stream.n_events,
                    stream.trace_end or 0, counters, flows, stream.skipped,
                    warn + [damage] if damage else warn, damage,
                    (stream.corrupt, stream.first_corrupt), args_file)


def _read_at(path: str, f: Any, pos: int, width: int) -> bytearray:
    """Up to `width` bytes of the file from `pos`."""
    data = bytearray(width)
    try:
        f.seek(pos)
        got = f.readinto(data)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read the file ({exc.strerror or exc})",
                               pos) from None
    del data[got:]
    return data


def _windows(path: str, f: Any, size: int, stream: _Stream) -> tuple[list[str], str]:
    """The file's windows decoded in turn, each ending at a packet's end. Returns the
    load's warnings and the damage warning ('' when none)."""
    warn: list[str] = []
    damage = ""
    pos, width = 0, WINDOW_BYTES
    retries = 0
    while pos < size:
        data = _read_at(path, f, pos, min(width, size - pos))
        hi = pos + len(data)
        at_end = hi >= size
        starts, ends, problem, position = packet_offsets(np.frombuffer(data, np.uint8))
        if problem == "truncated" and not at_end:
            if not len(starts):  # one packet larger than the window
                width *= 2
                continue
            problem = None  # the cut packet is read by the next window
        if problem == "corrupt" and not len(starts) and stream.n_packets == 0:
            raise TraceFormatError(path, "not a Perfetto trace (the first bytes are not a "
                                   "packet)", 0)
        if problem == "truncated" and not len(starts) and stream.n_packets == 0:
            raise TraceFormatError(path, "no complete Perfetto packet: the file is cut short "
                                   "before its first packet ends, or it is not a trace", 0)
        if problem == "corrupt":
            damage = (f"{path}: the data at byte {pos + position} is not a Perfetto packet "
                      f"(the file is damaged there); loaded the "
                      f"{stream.n_packets + len(starts)} packets before it, the rest of the "
                      "file is lost")
        while len(starts):
            try:
                stream.window(data, pos, starts, ends)
                break
            except WireError as exc:
                # a packet whose framing held but whose fields do not: the damage starts there
                first_bad = int(np.searchsorted(ends, exc.position, side="left"))
                retries += 1
                if stream.n_packets + first_bad == 0 or first_bad >= len(starts):
                    raise TraceFormatError(path, f"corrupt packet: {exc.reason}",
                                           pos + exc.position) from None
                if retries >= DAMAGE_RETRIES:
                    raise TraceFormatError(path, "corrupt packets throughout the file",
                                           pos + int(ends[-1])) from None
                damage = (f"{path}: packet {stream.n_packets + first_bad} (byte "
                          f"{pos + int(starts[first_bad])}) is corrupt ({exc.reason}); loaded "
                          f"the {stream.n_packets + first_bad} packets before it, the rest of "
                          "the file is lost")
                starts, ends = starts[:first_bad], ends[:first_bad]
                problem = "corrupt"
        if problem == "truncated":
            msg = (f"{path}: the trace ends inside a packet at byte {pos + position} (was the "
                   f"recording killed?); loaded the {stream.n_packets} complete packets")
            warnings.warn(msg, TruncatedTraceWarning, stacklevel=4)
            warn.append(msg)
        if problem is not None:
            break
        pos = pos + int(ends[-1]) if len(ends) else hi
        width = WINDOW_BYTES
    return warn, damage


def say_damage(streamed: Streamed) -> None:
    """The damage warning, said as `load_pftrace` says it: once the load has succeeded."""
    if streamed.damage:
        warnings.warn(streamed.damage, DamagedTraceWarning, stacklevel=4)


def _joined(parts: list[tuple[np.ndarray, ...]], width: int,
            dtypes: tuple[Any, ...]) -> Any:
    return tuple(np.concatenate([p[i] for p in parts]).astype(dtypes[i], copy=False)
                 if parts else np.zeros(0, dtypes[i]) for i in range(width))


# Begins and ends paired at once: each chunk's pairing sorts and scans its events again
# (1 M-slice synthetic, the pairing's peak: 239 MiB at 1 M a chunk, 157 at 256 k).
EDGES_PER_CHUNK = 1 << 18


def pair_slices(streamed: Streamed) -> tuple[np.ndarray, np.ndarray]:
    """Pair the begins and ends per track in time order (file order at equal times), a
    chunk of the sorted events at a time, the begins still open carried to the next chunk:
    the pairs, depths and parents a pass over all of them at once gives (`_slices`). The
    slices go to the spill's `slices` table in the order they are paired (which keeps a
    track's slices of equal time and depth in file order, as the whole pass does); returns
    each matched end's event and its begin's."""
    spill = streamed.spill
    order = track_time_order(spill.column("edges", "track"), spill.column("edges", "ts"))
    columns = {name: spill.column("edges", name) for name in SPILLED["edges"]}
    open_: dict[str, np.ndarray] = {name: c[:0] for name, c in columns.items()}
    open_["depth"] = open_["parent"] = np.zeros(0, np.int64)
    ends: list[tuple[np.ndarray, np.ndarray]] = []
    dropped = 0
    for lo in range(0, len(order), EDGES_PER_CHUNK):
        at = order[lo:lo + EDGES_PER_CHUNK]
        k = len(open_["ts"])
        s = {name: np.r_[open_[name], c[at]] for name, c in columns.items()}
        s["begin"][:k] = True
        b, e, depth, parent = match_begin_end(s["track"], s["begin"], s["ts"])
        b_event = s["event"][b]
        parent_event = np.where(parent >= 0, b_event[np.maximum(parent, 0)], -1)
        dropped += int((~s["begin"]).sum()) - int((e >= 0).sum())
        ended = np.flatnonzero(e >= 0)
        ends.append((s["event"][e[ended]], b_event[ended]))
        spill.add("slices", event=b_event[ended], track=s["track"][b[ended]],
                  ts=s["ts"][b[ended]], dur=s["ts"][e[ended]] - s["ts"][b[ended]],
                  depth=depth[ended], parent=parent_event[ended], name=s["name"][b[ended]],
                  cat=s["cat"][b[ended]])
        still = np.flatnonzero(e < 0)  # in (track, time, file) order: as the stream has them
        still = still[np.argsort(b[still], kind="stable")]
        open_ = {name: s[name][b[still]] for name in columns}
        open_["depth"], open_["parent"] = depth[still], parent_event[still]
    del order, columns
    if dropped:
        streamed.skipped["slice end without begin"] += dropped
    if len(open_["ts"]):
        streamed.skipped["slice never ended (closed at trace end)"] += len(open_["ts"])
        spill.add("slices", event=open_["event"], track=open_["track"], ts=open_["ts"],
                  dur=streamed.trace_end - open_["ts"], depth=open_["depth"],
                  parent=open_["parent"], name=open_["name"], cat=open_["cat"])
    return (np.concatenate([x[0] for x in ends]) if ends else np.zeros(0, np.int64),
            np.concatenate([x[1] for x in ends]) if ends else np.zeros(0, np.int64))
