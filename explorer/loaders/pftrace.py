"""Perfetto protobuf traces (`.pftrace`, TrackEvent), read with vectorised wire scanning.

`wire_scan` walks the packets and their track events column-wise in numpy: every
event's type, track, name and category become arrays without a Python object per
event. The few packets that describe tracks, intern names or set defaults are read
one by one by the small wire reader below. Interned names are kept per packet
sequence and per incremental-state generation, as Perfetto defines. Debug
annotations (slice args) are decoded on first use (`pftrace_annotations`).

`_decode` runs the phases in order: packets, per-packet state, events, names and
categories, tracks, slices, then counters, args and flows.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd
from neuron_explorer.common import perfetto_fields as F
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.errors import (
    DamagedTraceWarning,
    TraceFormatError,
    TraceFormatWarning,
    TruncatedTraceWarning,
)
from neuron_explorer.loaders.args import LazyArgs
from neuron_explorer.loaders.kinds import our_kind
from neuron_explorer.loaders.metadata import merge_metadata, missing_end_mark
from neuron_explorer.loaders.nesting import bind_flow_points, match_begin_end
from neuron_explorer.loaders.pftrace_annotations import (
    Annotations,
    decode_annotations,
    interned_keys,
)
from neuron_explorer.loaders.raw import COUNTER_COLUMNS, FLOW_COLUMNS, RawTrace, build_slices
from neuron_explorer.loaders.track_kinds import our_device, track_table
from neuron_explorer.loaders.wire_scan import (
    Scan,
    WireError,
    packet_offsets,
    prefer_compiled_for,
    read_message,
    scan,
)

# where wire_scan puts each TrackEvent field read; both counter fields share slot 4
EVENT_SLOTS = {F.E_TYPE: 0, F.E_NAME_IID: 1, F.E_TRACK: 2, F.E_NAME: 3, F.E_COUNTER: 4,
               F.E_DOUBLE_COUNTER: 4}
EVENT_REPEATED = {F.E_CATEGORY_IIDS, F.E_CATEGORIES, F.E_DEBUG, F.E_FLOW_IDS_OLD,
                  F.E_TERMINATING_FLOW_IDS_OLD, F.E_FLOW_IDS, F.E_TERMINATING_FLOW_IDS}
# packet field -> slot; the three fields read one by one share slot 5
PACKET_SLOTS = {F.P_TIMESTAMP: 0, F.P_SEQ_ID: 1, F.P_FLAGS: 2,
                F.P_INCREMENTAL_STATE_CLEARED: 3, F.P_TRACK_EVENT: 4, F.P_INTERNED: 5,
                F.P_TRACE_PACKET_DEFAULTS: 5, F.P_TRACK_DESCRIPTOR: 5}
# clock id, first packet on sequence, previous packet dropped: nothing to load
IGNORED_PACKET_FIELDS = {F.P_TIMESTAMP_CLOCK_ID, F.P_FIRST_ON_SEQUENCE,
                         F.P_PREVIOUS_PACKET_DROPPED}
# InternedData fields -> the table each fills
INTERNED_KINDS = {F.I_CATEGORIES: "cat", F.I_NAMES: "name", F.I_ANNOTATION_NAMES: "ann",
                  F.I_DEBUG_ANNOTATION_STRING_VALUES: "str"}


class Descriptor:
    """The parts of a TrackDescriptor the loader uses."""

    def __init__(self) -> None:
        self.uuid = 0
        self.parent_uuid = 0
        self.name = ""
        self.process: tuple[int, str] | None = None  # pid, process name
        self.thread: tuple[int, int, str] | None = None  # pid, tid, thread name
        self.counter = False


def _int64(value: int) -> int:
    """A varint as the signed 64-bit integer it encodes (negative ids take ten bytes)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(data: bytes | bytearray, offset: int, length: int) -> str:
    return data[offset:offset + length].decode("utf-8", "replace")


class DecodeState:
    """Interned names, track descriptors and defaults, gathered packet by packet."""

    def __init__(self) -> None:
        self.interned: dict[tuple[int, int, str], dict[int, str]] = {}
        self.descriptors: dict[int, Descriptor] = {}
        self.default_track: dict[int, int] = {}
        self.pairs: list[tuple[int, int]] = []  # (sequence, generation) by id

    def resolve_string_codes(self, seqgen: np.ndarray, iids: np.ndarray
                             ) -> tuple[np.ndarray, list[str | None]]:
        """Interned debug-annotation string values, as codes into the distinct ones (None
        where never interned)."""
        return _resolve_codes(self, "str", seqgen, iids, self.pairs, None)

    def read(self, data: bytes | bytearray, start: int, end: int, seq: int, gen: int) -> None:
        """Take interned data, a track descriptor or defaults from one packet."""
        for field, value, offset in read_message(data, start, end):
            if field == F.P_INTERNED:
                self._interned(data, offset, offset + value, seq, gen)
            elif field == F.P_TRACK_DESCRIPTOR:
                self._descriptor(data, offset, offset + value)
            elif field == F.P_TRACE_PACKET_DEFAULTS:
                for f, v, o in read_message(data, offset, offset + value):
                    if f == F.DEFAULTS_TRACK_EVENT:
                        for f2, v2, _ in read_message(data, o, o + v):
                            if f2 == F.DEFAULTS_TRACK_UUID:
                                self.default_track[seq] = v2

    def _interned(self, data: bytes | bytearray, start: int, end: int, seq: int, gen: int) -> None:
        for field, value, offset in read_message(data, start, end):
            kind = INTERNED_KINDS.get(field)
            if kind is None:
                continue
            iid, text = 0, ""
            for f, v, o in read_message(data, offset, offset + value):
                if f == F.INTERNED_IID:
                    iid = v
                elif f == F.INTERNED_TEXT:
                    text = _text(data, o, v)
            self.interned.setdefault((seq, gen, kind), {})[iid] = text

    def _descriptor(self, data: bytes | bytearray, start: int, end: int) -> None:
        d = Descriptor()
        for field, value, offset in read_message(data, start, end):
            if field == F.D_UUID:
                d.uuid = value
            elif field == F.D_PARENT:
                d.parent_uuid = value
            elif field in (F.D_NAME, F.D_STATIC_NAME) and not d.name:
                d.name = _text(data, offset, value)
            elif field == F.D_PROCESS:
                pid, pname = 0, ""
                for f, v, o in read_message(data, offset, offset + value):
                    if f == F.PROCESS_PID:
                        pid = _int64(v)
                    elif f == F.PROCESS_NAME:
                        pname = _text(data, o, v)
                d.process = (pid, pname)
            elif field == F.D_THREAD:
                pid = tid = 0
                tname = ""
                for f, v, o in read_message(data, offset, offset + value):
                    if f == F.THREAD_PID:
                        pid = _int64(v)
                    elif f == F.THREAD_TID:
                        tid = _int64(v)
                    elif f == F.THREAD_NAME:
                        tname = _text(data, o, v)
                d.thread = (pid, tid, tname)
            elif field == F.D_COUNTER:
                d.counter = True
        self.descriptors[d.uuid] = d


_Missing = TypeVar("_Missing", str, None)  # what stands for an iid never interned


def _resolve_codes(state: DecodeState, kind: str, seqgen: np.ndarray, keys: np.ndarray,
                   seqgen_pairs: list[tuple[int, int]], missing: _Missing
                   ) -> tuple[np.ndarray, list[str | _Missing]]:
    """Interned iids -> a code per key into a list of strings, looked up once per distinct
    (sequence, generation, iid); `missing` where an iid was never interned."""
    if not len(keys):
        return np.zeros(0, np.intp), []
    inverse, pairs = interned_keys(seqgen, keys)
    names: list[str | _Missing] = []
    for sg, iid in pairs:
        seq, gen = seqgen_pairs[sg]
        names.append(state.interned.get((seq, gen, kind), {}).get(iid, missing))
    return inverse, names


class EventTexts:
    """One text per event ('' unless set), kept as a code into distinct strings until the
    slices need the column: events outnumber distinct names many times over."""

    def __init__(self, n: int) -> None:
        self.codes = np.zeros(n, np.int32)  # distinct texts are few
        self.values: list[str] = [""]

    def put(self, events: np.ndarray, codes: np.ndarray, values: list[str]) -> None:
        """Set the given events' texts to values[codes]."""
        self.codes[events] = codes + len(self.values)
        self.values.extend(values)

    def put_strings(self, events: np.ndarray, texts: list[str]) -> None:
        """Set the given events' texts, one string each."""
        if len(texts):
            codes, uniques = pd.factorize(np.asarray(texts, object))
            self.put(events, codes, uniques.tolist())

    def column(self, events: np.ndarray) -> np.ndarray:
        """The texts of the given events, as an object array."""
        return np.asarray(self.values, object)[self.codes[events]]

    def mapped(self, events: np.ndarray, fn: Any) -> np.ndarray:
        """fn of the given events' texts, called once per distinct text."""
        return np.asarray([fn(v) for v in self.values], object)[self.codes[events]]

    def coded(self, events: np.ndarray, fn: Any = None) -> tuple[np.ndarray, list[str]]:
        """The given events' texts (or fn of them) as codes into distinct strings."""
        values = list(self.values)
        return self.codes[events], [fn(v) for v in values] if fn is not None else values


def _strings(data: bytes | bytearray, offsets: np.ndarray, lengths: np.ndarray) -> list[str]:
    return [data[o:o + n].decode("utf-8", "replace")
            for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)]


def decoded_tracks(state: DecodeState, used: np.ndarray) -> tuple[pd.DataFrame, dict[int, int]]:
    """Track table for the descriptors (and for uuids events use without one)."""
    desc = state.descriptors
    uuids = list(desc) + [int(u) for u in np.unique(used).tolist() if int(u) not in desc]
    track_of = {u: i for i, u in enumerate(uuids)}
    proc_by_pid: dict[int, str] = {}
    for known in desc.values():
        if known.process is not None:
            proc_by_pid[known.process[0]] = (known.process[1] or known.name
                                             or str(known.process[0]))

    def process_of(d: Descriptor, depth: int = 0) -> tuple[str, int]:
        if d.process is not None:
            return proc_by_pid.get(d.process[0], d.name), d.process[0]
        if d.thread is not None:
            return proc_by_pid.get(d.thread[0], str(d.thread[0])), d.thread[0]
        parent = desc.get(d.parent_uuid) if d.parent_uuid else None
        if parent is not None and depth < 8:
            return process_of(parent, depth + 1)
        return "", -1

    rows = []
    for u in uuids:
        d = desc.get(u)
        if d is None:
            rows.append((track_of[u], f"track {u}", "thread", "", -1, -1, -1))
            continue
        pname, pid = process_of(d)
        name = d.name
        tid = d.thread[1] if d.thread is not None else -1
        if d.thread is not None:
            name = d.thread[2] or name or f"thread {tid}"
        elif d.process is not None:
            name = name or pname
        device, kind = our_device(pname, name)
        if d.counter:
            kind = "counter"
        elif device < 0:
            kind = "process" if d.process is not None else "thread"
        rows.append((track_of[u], name, kind, pname, pid, tid, device))
    return track_table(rows), track_of


DAMAGE_RETRIES = 8  # corrupt packets left out, each with what follows it, before giving up


def load_pftrace(path: str, data: bytes | bytearray) -> RawTrace:
    """Read a Perfetto TrackEvent trace into columns."""
    buf = np.frombuffer(data, np.uint8)
    starts, ends, problem, position = packet_offsets(buf)
    warn: list[str] = []
    if problem == "corrupt" and not len(starts):
        raise TraceFormatError(path, "not a Perfetto trace (the first bytes are not a packet)", 0)
    # What was recorded before damage is still the run: it is loaded, with one warning
    # (said once the load succeeds: a corrupt packet found while decoding comes earlier).
    damage = ""
    if problem == "corrupt":
        damage = (f"{path}: the data at byte {position} is not a Perfetto packet (the file is "
                  f"damaged there); loaded the {len(starts)} packets before it, the rest of "
                  "the file is lost")
    if problem == "truncated" and not len(starts):
        raise TraceFormatError(path, "no complete Perfetto packet: the file is cut short before "
                               "its first packet ends, or it is not a trace", 0)
    if problem == "truncated":
        msg = (f"{path}: the trace ends inside a packet at byte {position} (was the recording "
               f"killed?); loaded the {len(starts)} complete packets")
        warnings.warn(msg, TruncatedTraceWarning, stacklevel=3)
        warn.append(msg)
    for _ in range(DAMAGE_RETRIES):
        try:
            raw = _decode(path, data, buf, starts, ends, warn + [damage] if damage else warn)
        except WireError as exc:
            # a packet whose framing held but whose fields do not: the damage starts there
            first_bad = int(np.searchsorted(ends, exc.position, side="left"))
            if first_bad == 0 or first_bad >= len(starts):
                raise TraceFormatError(path, f"corrupt packet: {exc.reason}",
                                       exc.position) from None
            damage = (f"{path}: packet {first_bad} (byte {int(starts[first_bad])}) is corrupt "
                      f"({exc.reason}); loaded the {first_bad} packets before it, the rest of "
                      "the file is lost")
            starts, ends = starts[:first_bad], ends[:first_bad]
            continue
        if damage:
            warnings.warn(damage, DamagedTraceWarning, stacklevel=3)
        return raw
    raise TraceFormatError(path, "corrupt packets throughout the file", int(ends[-1]))


def _decode(path: str, data: bytes | bytearray, buf: np.ndarray, starts: np.ndarray,
            ends: np.ndarray, warn: list[str]) -> RawTrace:
    skipped: Counter[str] = Counter()
    pk = _packets(path, buf, starts, ends, skipped)
    state = DecodeState()
    for i in pk.stateful.tolist():  # in file order
        state.read(data, int(starts[i]), int(ends[i]), int(pk.seq[i]), int(pk.gen[i]))
    state.pairs = pk.pairs
    # only the track events' packets matter from here: the other packets' columns are let
    # go before the events are scanned
    at = _EventPackets.of(pk)
    del pk
    ev = _events(data, buf, at, state, skipped)
    del at
    ev_name, ev_cat = ev.name, ev.cat
    tracks, track_of = decoded_tracks(state, np.sort(pd.unique(ev.track_uuid)))
    ev_track = _track_ids(track_of, ev.track_uuid)
    ev.track_uuid = ev.track_uuid[:0]  # the track ids say it from here: let it go
    sl = _slices(ev, ev_track, skipped)
    slices, order = build_slices(ev_track[sl.events], ev.ts[sl.events], sl.dur,
                                 ev_name.coded(sl.events), ev_cat.coded(sl.events),
                                 ev_cat.coded(sl.events, our_kind), sl.depth, sl.parent)
    slice_of_event, new_id = _slice_of_event(len(ev.ts), sl, order)
    counters = _counters(ev, ev_track, tracks)
    ann = Annotations.of(ev.annotations, slice_of_event)
    n_slices = len(slices)
    # args are decoded on first use; the metadata instant's now (the hardware figures)
    meta_codes = [i for i, c in enumerate(ev_cat.values) if c == tf.CAT_METADATA]
    meta_ids = np.sort(new_id[_among(ev_cat.codes[sl.events], meta_codes)])
    meta_args = decode_annotations(data, buf, ann.subset(_among(ann.sid, meta_ids)), ev.seqgen,
                                   state, n_slices)
    metadata = merge_metadata(path, meta_args.column(tf.ARG_METADATA_JSON, meta_ids).tolist())
    unfinished = missing_end_mark(path, metadata)
    if unfinished and not any("(was the recording killed?)" in w for w in warn):
        warnings.warn(unfinished, TruncatedTraceWarning, stacklevel=4)
        warn.append(unfinished)
    skipped_now = dict(skipped)

    def dropped(count: int, position: int) -> None:  # heard when the args are first decoded
        msg = (f"{path}: {count} debug annotations (slice args) are corrupt, the first at "
               f"byte {position}; they were left out")
        warnings.warn(msg, TraceFormatWarning, stacklevel=2)
        warn.append(msg)
        skipped_now["corrupt debug annotation"] = count

    seqgen, ts, flow_ids = ev.seqgen, ev.ts, ev.flow_ids
    del ev  # the args and flows read on first use hold only what they need
    args = LazyArgs(lambda: decode_annotations(data, buf, ann, seqgen, state, n_slices,
                                               dropped))
    # flows are linked on first use: the overview does not need them
    return RawTrace(path=path, source_format="pftrace", slices=slices, args=args,
                    tracks=tracks, counters=counters,
                    flows=lambda: _flows(flow_ids, ts, slice_of_event), metadata=metadata,
                    skipped=skipped_now, warnings=warn)


def _among(values: np.ndarray, few: Sequence[int] | np.ndarray) -> np.ndarray:
    """Which of `values` are among `few` (a handful): a comparison per value wanted. np.isin
    sorted the 16 M annotation rows of an engine-level trace to find its metadata's two,
    300 MiB at the load's peak."""
    found = np.zeros(len(values), bool)
    for value in np.asarray(few).tolist():
        found |= values == value
    return found


@dataclass
class _Packets:
    """Per packet: timestamp, sequence, generation of incremental state and the number of
    its (sequence, generation) pair; `pairs` lists those pairs. `event` names the packets
    holding a track event, with the event's bytes (`event_offset`, `event_length`);
    `stateful` those holding interned data, a track descriptor or defaults."""

    ts: np.ndarray
    seq: np.ndarray
    gen: np.ndarray
    pair: np.ndarray
    pairs: list[tuple[int, int]]
    event: np.ndarray
    event_offset: np.ndarray
    event_length: np.ndarray
    stateful: np.ndarray


# Packets scanned at once: the scan's slots (six numbers per packet, and their fields)
# were the load's largest transient when every packet was scanned together.
PACKETS_PER_CHUNK = 1 << 18


def _packets(path: str, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
             skipped: Counter[str]) -> _Packets:
    """Scan every packet's fields, a chunk at a time; count the unknown ones; number the
    sequences' incremental-state generations."""
    n = len(starts)
    prefer_compiled_for(int((ends - starts).sum()))  # chunks of a large trace: compiled
    p_ts, p_seq, cleared = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, bool)
    events, stateful = _Chunks(3), _Chunks(1)
    for lo in range(0, n, PACKETS_PER_CHUNK):
        part = slice(lo, min(lo + PACKETS_PER_CHUNK, n))
        pk = scan(buf, starts[part], ends[part], PACKET_SLOTS, set(), offsets={4})
        for number, count in Counter(pk.others[~np.isin(pk.others,
                                                        list(IGNORED_PACKET_FIELDS))]
                                     .tolist()).items():
            skipped[f"packet field {number}"] += count
        late = np.flatnonzero(pk.value[0] >= np.uint64(1 << 63))
        if len(late):
            raise TraceFormatError(path, f"packet timestamp {int(pk.value[0][late[0]])} ns is "
                                   "past what 64-bit signed times hold",
                                   int(starts[lo + late[0]]))
        p_ts[part] = pk.value[0].astype(np.int64)
        p_seq[part] = pk.value[1].astype(np.int64)
        cleared[part] = (((pk.value[2] & np.uint64(F.SEQ_INCREMENTAL_STATE_CLEARED)) != 0)
                         | (pk.value[3] != 0))
        at = np.flatnonzero(pk.field[4] != 0)
        events.add(at + lo, pk.offset[4][at], pk.value[4][at].astype(np.int64))
        stateful.add(np.flatnonzero(pk.field[5] != 0) + lo)
        del pk
    if n and (p_seq == p_seq[0]).all():
        # one sequence (one writer, as ours): generations count up from the first packet's,
        # so each packet's (sequence, generation) pair is numbered by its generation
        p_gen = np.cumsum(cleared, dtype=np.int64)
        first = int(p_gen[0])
        p_pair = p_gen - first
        uniq_combo = int(p_seq[0]) * (1 << 32) + np.arange(first, int(p_gen[-1]) + 1)
    else:
        p_gen = np.zeros(n, np.int64)
        for seq in pd.unique(p_seq).tolist():
            idx = np.flatnonzero(p_seq == seq)
            p_gen[idx] = np.cumsum(cleared[idx])
        combo = p_seq * (1 << 32) + p_gen
        p_pair, uniq_combo = pd.factorize(combo)  # hashing: no sort of every packet
    pairs = [(int(c) >> 32, int(c) & 0xFFFFFFFF) for c in uniq_combo.tolist()]
    event, event_offset, event_length = events.joined()
    return _Packets(p_ts, p_seq, p_gen, p_pair, pairs, event, event_offset, event_length,
                    stateful.joined()[0])


@dataclass
class _EventPackets:
    """The packets holding a track event: their numbers, the event's bytes (offset,
    length), and the packet's time, sequence and (sequence, generation) pair number."""

    packet: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    ts: np.ndarray
    seq: np.ndarray
    pair: np.ndarray

    @classmethod
    def of(cls, pk: _Packets) -> _EventPackets:
        at = pk.event
        return cls(at, pk.event_offset, pk.event_length, pk.ts[at], pk.seq[at],
                   _narrow(pk.pair[at]))


def _narrow(numbers: np.ndarray) -> np.ndarray:
    """Small non-negative numbers (one per event) as int32 where they fit: half the memory."""
    fits = not len(numbers) or int(numbers.max()) < 2**31
    return numbers.astype(np.int32 if fits else np.int64)


# Track events scanned at once: a chunk's field scan (slots and a row per repeated
# field) is the load's largest transient, so a chunk at a time keeps it small whatever
# the trace's size; each chunk leaves only compact columns behind.
EVENTS_PER_CHUNK = 1 << 18


@dataclass
class _Events:
    """Per track event, compact: time, (sequence, generation) pair number, type (one
    byte; types past what it holds were counted as skipped and read as 0), track uuid
    (the sequence's default where the event names none), name and first category;
    and the rows later phases read: debug annotations (event, length, offset),
    flow ids (id, event, terminating) and counter values (event, raw, is a double)."""

    ts: np.ndarray
    seqgen: np.ndarray
    type: np.ndarray
    track_uuid: np.ndarray
    name: EventTexts
    cat: EventTexts
    annotations: list[np.ndarray]
    flow_ids: list[np.ndarray]
    counter_values: list[np.ndarray]


def _events(data: bytes | bytearray, buf: np.ndarray, at: _EventPackets, state: DecodeState,
            skipped: Counter[str]) -> _Events:
    """Scan every track event's fields, a chunk of events at a time."""
    n = len(at.offset)
    prefer_compiled_for(int(at.length.sum()))  # chunks of a large trace: worth compiling
    ev_type = np.zeros(n, np.int8)
    track_uuid = np.zeros(n, np.uint64)
    name, cat = EventTexts(n), EventTexts(n)
    annotations, flows, counters = _Chunks(3), _Chunks(3), _Chunks(3)
    for lo in range(0, n, EVENTS_PER_CHUNK):
        part = slice(lo, min(lo + EVENTS_PER_CHUNK, n))
        es = scan(buf, at.offset[part], at.offset[part] + at.length[part], EVENT_SLOTS,
                  EVENT_REPEATED, offsets={3})
        ev_type[part] = event_types(es.value[0], skipped)
        uuid = es.value[2]
        has_track = es.field[2] != 0
        if not has_track.all():
            uuid = uuid.copy()
            uuid[~has_track] = np.array([state.default_track.get(int(q), 0)
                                         for q in at.seq[part][~has_track].tolist()], np.uint64)
        track_uuid[part] = uuid
        event_names(data, es, at.pair[part], lo, state, name, cat)
        ev, _, length, offset = es.rows.select(F.E_DEBUG)
        # a row per annotation, millions of them: event numbers and lengths in 32 bits (and
        # not their wire type, which is always a message's)
        annotations.add(_narrow(ev.astype(np.int64) + lo), _narrow(length), offset)
        fid, ev, term = event_flow_ids(es.rows)
        flows.add(fid, ev.astype(np.int64) + lo, term)
        idx = np.flatnonzero(es.value[0] == F.TYPE_COUNTER)
        counters.add(idx + lo, es.value[4][idx], es.field[4][idx] == F.E_DOUBLE_COUNTER)
        del es
    return _Events(at.ts, at.pair, ev_type, track_uuid, name, cat, annotations.joined(),
                   flows.joined(), counters.joined())


def event_types(types: np.ndarray, skipped: Counter[str]) -> np.ndarray:
    """A chunk's event types in one byte each: the unknown ones counted as skipped and
    read as 0 (unspecified), which no later phase takes."""
    known = (types >= F.TYPE_SLICE_BEGIN) & (types <= F.TYPE_COUNTER)
    if known.all():
        return types.astype(np.int8)
    for t, count in Counter(types[~known].tolist()).items():
        skipped[f"track event type {t}"] += count
    return np.where(known, types, 0).astype(np.int8)


class _Chunks:
    """Columns gathered a chunk at a time, concatenated at the end."""

    def __init__(self, width: int) -> None:
        self.parts: list[list[np.ndarray]] = [[] for _ in range(width)]

    def add(self, *columns: np.ndarray) -> None:
        for part, column in zip(self.parts, columns, strict=True):
            part.append(column)

    def joined(self) -> list[np.ndarray]:
        """The columns whole; each column's chunks let go once it is joined (all of them
        held to the end doubled the 16 M annotation rows of an engine-level trace)."""
        out = []
        for i, part in enumerate(self.parts):
            out.append(np.concatenate(part) if part else np.zeros(0, np.int64))
            self.parts[i] = []
        return out


def event_names(data: bytes | bytearray, es: Scan, seqgen: np.ndarray, first: int,
                state: DecodeState, name: EventTexts, cat: EventTexts) -> None:
    """Each event's name (interned or inline) and first category, for the chunk of events
    scanned in `es` (event `first` onwards)."""
    ef, pairs = es.rows, state.pairs
    m = np.flatnonzero(es.field[1] == F.E_NAME_IID)
    name.put(m + first, *_resolve_codes(state, "name", seqgen[m], es.value[1][m], pairs, ""))
    m = np.flatnonzero(es.field[3] == F.E_NAME)
    name.put_strings(m + first, _strings(data, es.offset[3][m], es.value[3][m]))
    m, _, v, _ = ef.select(F.E_CATEGORY_IIDS)
    _, at = np.unique(m, return_index=True)  # rows come in file order: first = earliest
    cat.put(m[at] + first, *_resolve_codes(state, "cat", seqgen[m[at]], v[at], pairs, ""))
    m, _, v, o = ef.select(F.E_CATEGORIES)
    _, at = np.unique(m, return_index=True)
    cat.put_strings(m[at] + first, _strings(data, o[at], v[at]))


def _track_ids(track_of: dict[int, int], track_uuid: np.ndarray) -> np.ndarray:
    """Each event's track id, from its track uuid."""
    if not len(track_uuid):
        return np.zeros(0, np.int64)
    uuid_list = np.array(list(track_of), np.uint64)
    track_ids = np.array(list(track_of.values()), np.int64)
    sorter = np.argsort(uuid_list)
    return track_ids[sorter][np.searchsorted(uuid_list[sorter], track_uuid)]


@dataclass
class _SliceEvents:
    """The slices in event terms: `events` (begins, then instants), their end events
    (-1 for an instant or a slice never ended), durations, depths and parents (positions
    in `events`); `n_begun` begins come first."""

    events: np.ndarray
    ends: np.ndarray
    dur: np.ndarray
    depth: np.ndarray
    parent: np.ndarray
    n_begun: int


def _slices(ev: _Events, ev_track: np.ndarray, skipped: Counter[str]) -> _SliceEvents:
    """Pair begins with ends per track, close what never ended at the trace's end, and
    nest each instant in the deepest slice holding it."""
    ev_type, ev_ts = ev.type, ev.ts
    be_idx = np.flatnonzero((ev_type == F.TYPE_SLICE_BEGIN) | (ev_type == F.TYPE_SLICE_END))
    b_local, e_local, depth, parent = match_begin_end(
        ev_track[be_idx], ev_type[be_idx] == F.TYPE_SLICE_BEGIN, ev_ts[be_idx])
    b_ev = be_idx[b_local]
    e_ev = np.where(e_local >= 0, be_idx[np.maximum(e_local, 0)], -1)
    dropped_ends = int((ev_type == F.TYPE_SLICE_END).sum()) - int((e_local >= 0).sum())
    if dropped_ends:
        skipped["slice end without begin"] += dropped_ends
    trace_end = int(ev_ts.max()) if len(ev_ts) else 0
    unfinished = e_ev < 0
    if unfinished.any():
        skipped["slice never ended (closed at trace end)"] += int(unfinished.sum())
    b_dur = np.where(unfinished, trace_end - ev_ts[b_ev], ev_ts[np.maximum(e_ev, 0)] - ev_ts[b_ev])
    inst_ev = np.flatnonzero(ev_type == F.TYPE_INSTANT)
    n_inst = len(inst_ev)
    i_depth, i_parent = nest_instants(ev_track[b_ev], ev_ts[b_ev], b_dur, depth, parent,
                                      ev_track[inst_ev], ev_ts[inst_ev])
    return _SliceEvents(np.r_[b_ev, inst_ev], e_ev, np.r_[b_dur, np.zeros(n_inst, np.int64)],
                        np.r_[depth, i_depth], np.r_[parent, i_parent], len(b_ev))


def nest_instants(b_track: np.ndarray, b_ts: np.ndarray, b_dur: np.ndarray,
                  depth: np.ndarray, parent: np.ndarray, i_track: np.ndarray,
                  i_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each instant's depth and parent (a position among the begun slices, -1): the
    deepest slice holding it, among its tracks' slices only."""
    n_inst = len(i_ts)
    i_depth, i_parent = np.zeros(n_inst, np.int64), np.full(n_inst, -1, np.int64)
    if n_inst and len(b_ts):
        near = np.flatnonzero(np.isin(b_track, np.unique(i_track)))
        # selected before the frame is made: no frame of every slice
        pre = pd.DataFrame({"id": near, "ts": b_ts[near], "dur": b_dur[near],
                            "track_id": b_track[near], "depth": depth[near],
                            "parent_id": parent[near]}, index=near)
        host = bind_flow_points(pre, i_track, i_ts, np.ones(n_inst, bool), parent_of=parent,
                                begin_ts=b_ts, begin_end=b_ts + b_dur)
        ok = host >= 0
        i_parent[ok] = host[ok]
        i_depth[ok] = depth[host[ok]] + 1
    return i_depth, i_parent


def _slice_of_event(n_events: int, sl: _SliceEvents, order: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Each event's slice id (a begin's and its end's: their slice; -1: none), and each
    slice event's id (`order`: build_slices' permutation)."""
    # int32 where the ids fit: the annotations' slice ids (a row each, 16 M in an
    # engine-level trace) are taken from it
    slice_of_event = np.full(n_events, -1, np.int32 if len(order) < 2**31 else np.int64)
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    slice_of_event[sl.events] = new_id
    ended = sl.ends >= 0
    slice_of_event[sl.ends[ended]] = new_id[: sl.n_begun][ended]
    return slice_of_event, new_id


def _counters(ev: _Events, ev_track: np.ndarray, tracks: pd.DataFrame) -> pd.DataFrame:
    idx, raw, double = ev.counter_values
    value = np.where(double, raw.view(np.float64), raw.view(np.int64).astype(np.float64))
    return counter_frame(ev.ts[idx], value, ev_track[idx], tracks)


def counter_frame(ts: np.ndarray, value: np.ndarray, track_id: np.ndarray,
                  tracks: pd.DataFrame) -> pd.DataFrame:
    """The counters table: each value at its time, with its track's name, by track and time
    (file order at equal times)."""
    names = tracks.set_index("track_id")["name"]
    frame = pd.DataFrame({"ts": ts, "value": value, "track_id": track_id},
                         columns=COUNTER_COLUMNS[:3])
    frame["name"] = names.reindex(frame["track_id"]).to_numpy()
    return frame.sort_values(["track_id", "ts"], kind="stable", ignore_index=True)


def event_flow_ids(ef: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The events' flow ids: (flow id, event, whether it terminates the flow)."""
    parts = []
    for field, terminating in ((F.E_FLOW_IDS, False), (F.E_FLOW_IDS_OLD, False),
                               (F.E_TERMINATING_FLOW_IDS, True),
                               (F.E_TERMINATING_FLOW_IDS_OLD, True)):
        m, _, v, _ = ef.select(field)
        parts.append((v.view(np.int64), m, np.full(len(m), terminating)))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def _flows(flow_ids: Sequence[np.ndarray], ev_ts: np.ndarray,
           slice_of_event: np.ndarray) -> pd.DataFrame:
    """Flow edges: consecutive events carrying the same flow id, cut after a terminating one."""
    fid, ev, term = flow_ids
    sid = slice_of_event[ev] if len(ev) else np.zeros(0, np.int64)
    return flow_edges(fid, ev, ev_ts[ev] if len(ev) else ev, sid, term)


def flow_edges(fid: np.ndarray, ev: np.ndarray, ts: np.ndarray, sid: np.ndarray,
               term: np.ndarray) -> pd.DataFrame:
    """The flows table from each flow id's events (event number, time, slice: -1 for none,
    whether it terminates the flow)."""
    keep = sid >= 0
    fid, ev, ts, term, sid = fid[keep], ev[keep], ts[keep], term[keep], sid[keep]
    order = np.lexsort((ev, ts, fid))
    fid, term, sid = fid[order], term[order], sid[order]
    link = (fid[1:] == fid[:-1]) & ~term[:-1] & (sid[1:] != sid[:-1])
    return pd.DataFrame({"flow_id": fid[1:][link], "src_id": sid[:-1][link],
                         "dst_id": sid[1:][link]}, columns=FLOW_COLUMNS).astype("int64")
