"""Perfetto protobuf traces (`.pftrace`, TrackEvent), read with vectorised wire scanning.

Packets that only carry track events (nearly all of them) are decoded column-wise
by `wire_scan`; the few that describe tracks, intern names or set defaults are
parsed one by one with Perfetto's own protobuf classes. Interned names are kept
per packet sequence and per incremental-state generation, as Perfetto defines.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer import trace_format as tf
from neuron_explorer.errors import TraceFormatError, TraceFormatWarning, TruncatedTraceWarning
from neuron_explorer.loaders.args import ColumnArgs, LazyArgs
from neuron_explorer.loaders.chrome_json import bind_flow_points
from neuron_explorer.loaders.kinds import DEVICE_PROCESS_NAME, our_kind
from neuron_explorer.loaders.metadata import check, merge_json
from neuron_explorer.loaders.nesting import match_begin_end
from neuron_explorer.loaders.pftrace_annotations import (
    Annotations,
    decode_annotations,
    interned_keys,
)
from neuron_explorer.loaders.raw import COUNTER_COLUMNS, FLOW_COLUMNS, RawTrace, build_slices
from neuron_explorer.loaders.track_kinds import device_track_kind
from neuron_explorer.loaders.wire_scan import Scan, WireError, packet_offsets, read_message, scan

# TracePacket fields
P_TIMESTAMP, P_TRACK_EVENT, P_SEQ_ID, P_INTERNED, P_FLAGS = 8, 11, 10, 12, 13
P_CLEARED, P_DEFAULTS, P_DESCRIPTOR = 41, 59, 60
SEQ_INCREMENTAL_STATE_CLEARED = 1
# TrackEvent fields
E_CATEGORY_IIDS, E_ANNOTATION, E_TYPE, E_NAME_IID, E_TRACK = 3, 4, 9, 10, 11
E_CATEGORIES, E_NAME, E_COUNTER_INT, E_COUNTER_DOUBLE = 22, 23, 30, 44
E_FLOW_OLD, E_TERM_FLOW_OLD, E_FLOW, E_TERM_FLOW = 36, 42, 47, 48
TYPE_BEGIN, TYPE_END, TYPE_INSTANT, TYPE_COUNTER = 1, 2, 3, 4
EVENT_SLOTS = {E_TYPE: 0, E_NAME_IID: 1, E_TRACK: 2, E_NAME: 3, E_COUNTER_INT: 4,
               E_COUNTER_DOUBLE: 4}
EVENT_REPEATED = {E_CATEGORY_IIDS, E_CATEGORIES, E_ANNOTATION, E_FLOW_OLD, E_TERM_FLOW_OLD, E_FLOW,
                  E_TERM_FLOW}
# packet field -> slot; the three fields read one by one share slot 5
PACKET_SLOTS = {P_TIMESTAMP: 0, P_SEQ_ID: 1, P_FLAGS: 2, P_CLEARED: 3, P_TRACK_EVENT: 4,
                P_INTERNED: 5, P_DEFAULTS: 5, P_DESCRIPTOR: 5}
# clock id, first packet on sequence, previous packet dropped: nothing to load
IGNORED_PACKET_FIELDS = {58, 87, 42}


# InternedData fields -> the table each fills
INTERNED_KINDS = {1: "cat", 2: "name", 3: "ann", 29: "str"}


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


def _text(data: bytes, offset: int, length: int) -> str:
    return data[offset:offset + length].decode("utf-8", "replace")


class _State:
    """Interned names, track descriptors and defaults, gathered packet by packet."""

    def __init__(self) -> None:
        self.interned: dict[tuple[int, int, str], dict[int, str]] = {}
        self.descriptors: dict[int, Descriptor] = {}
        self.default_track: dict[int, int] = {}
        self.pairs: list[tuple[int, int]] = []  # (sequence, generation) by id

    def resolve_strings(self, seqgen: np.ndarray, iids: np.ndarray) -> np.ndarray:
        """Interned debug-annotation string values."""
        return _resolve(self, "str", seqgen, iids, self.pairs)

    def read(self, data: bytes, start: int, end: int, seq: int, gen: int) -> None:
        """Take interned data, a track descriptor or defaults from one packet."""
        for field, value, offset in read_message(data, start, end):
            if field == P_INTERNED:
                self._interned(data, offset, offset + value, seq, gen)
            elif field == P_DESCRIPTOR:
                self._descriptor(data, offset, offset + value)
            elif field == P_DEFAULTS:
                for f, v, o in read_message(data, offset, offset + value):
                    if f == 11:  # track_event_defaults
                        for f2, v2, _ in read_message(data, o, o + v):
                            if f2 == 11:  # track_uuid
                                self.default_track[seq] = v2

    def _interned(self, data: bytes, start: int, end: int, seq: int, gen: int) -> None:
        for field, value, offset in read_message(data, start, end):
            kind = INTERNED_KINDS.get(field)
            if kind is None:
                continue
            iid, text = 0, ""
            for f, v, o in read_message(data, offset, offset + value):
                if f == 1:
                    iid = v
                elif f == 2:
                    text = _text(data, o, v)
            self.interned.setdefault((seq, gen, kind), {})[iid] = text

    def _descriptor(self, data: bytes, start: int, end: int) -> None:
        d = Descriptor()
        for field, value, offset in read_message(data, start, end):
            if field == 1:
                d.uuid = value
            elif field == 5:
                d.parent_uuid = value
            elif field in (2, 10) and not d.name:
                d.name = _text(data, offset, value)
            elif field == 3:
                pid, pname = 0, ""
                for f, v, o in read_message(data, offset, offset + value):
                    if f == 1:
                        pid = _int64(v)
                    elif f == 6:
                        pname = _text(data, o, v)
                d.process = (pid, pname)
            elif field == 4:
                pid = tid = 0
                tname = ""
                for f, v, o in read_message(data, offset, offset + value):
                    if f == 1:
                        pid = _int64(v)
                    elif f == 2:
                        tid = _int64(v)
                    elif f == 5:
                        tname = _text(data, o, v)
                d.thread = (pid, tid, tname)
            elif field == 8:
                d.counter = True
        self.descriptors[d.uuid] = d


def _resolve_codes(state: _State, kind: str, seqgen: np.ndarray, keys: np.ndarray,
                   seqgen_pairs: list[tuple[int, int]], missing: str | None = None
                   ) -> tuple[np.ndarray, list[str | None]]:
    """Interned iids -> a code per key into a list of strings, looked up once per distinct
    (sequence, generation, iid); `missing` where an iid was never interned."""
    if not len(keys):
        return np.zeros(0, np.intp), []
    inverse, pairs = interned_keys(seqgen, keys)
    names = []
    for sg, iid in pairs:
        seq, gen = seqgen_pairs[sg]
        names.append(state.interned.get((seq, gen, kind), {}).get(iid, missing))
    return inverse, names


def _resolve(state: _State, kind: str, seqgen: np.ndarray, keys: np.ndarray,
             seqgen_pairs: list[tuple[int, int]]) -> np.ndarray:
    """Interned iids -> strings (None where never interned)."""
    out = np.empty(len(keys), object)
    if len(keys):
        codes, names = _resolve_codes(state, kind, seqgen, keys, seqgen_pairs)
        out[:] = np.asarray(names, object)[codes]
    return out


class _EventTexts:
    """One text per event ('' unless set), kept as a code into distinct strings until the
    slices need the column: events outnumber distinct names many times over."""

    def __init__(self, n: int) -> None:
        self.codes = np.zeros(n, np.int64)
        self.values: list[str | None] = [""]

    def put(self, events: np.ndarray, codes: np.ndarray, values: list[str | None]) -> None:
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


def _strings(data: bytes, offsets: np.ndarray, lengths: np.ndarray) -> list[str]:
    return [data[o:o + n].decode("utf-8", "replace")
            for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)]


def _tracks(state: _State, used: np.ndarray) -> tuple[pd.DataFrame, dict[int, int]]:
    """Track table for the descriptors (and for uuids events use without one)."""
    desc = state.descriptors
    uuids = list(desc) + [int(u) for u in np.unique(used).tolist() if int(u) not in desc]
    track_of = {u: i for i, u in enumerate(uuids)}
    proc_by_pid: dict[int, str] = {}
    for d in desc.values():
        if d.process is not None:
            proc_by_pid[d.process[0]] = d.process[1] or d.name or str(d.process[0])

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
        ours = DEVICE_PROCESS_NAME.match(pname)
        device = int(ours.group(1)) if ours else -1
        if d.counter:
            kind = "counter"
        elif ours:
            kind = device_track_kind(name)
        elif d.process is not None:
            kind = "process"
        else:
            kind = "thread"
        rows.append((track_of[u], name, kind, pname, pid, tid, device))
    frame = pd.DataFrame(rows, columns=["track_id", "name", "kind", "process", "pid", "tid",
                                        "device"])
    frame = frame.astype({"track_id": "int64", "pid": "int64", "tid": "int64", "device": "int64"})
    return frame, track_of


def load_pftrace(path: str, data: bytes) -> RawTrace:
    """Read a Perfetto TrackEvent trace into columns."""
    buf = np.frombuffer(data, np.uint8)
    starts, ends, problem, position = packet_offsets(buf)
    warn: list[str] = []
    if problem == "corrupt" and not len(starts):
        raise TraceFormatError(path, "not a Perfetto trace (the first bytes are not a packet)", 0)
    if problem == "corrupt":
        raise TraceFormatError(path, "corrupt data after the last good packet "
                               f"({len(starts)} packets read)", position)
    if problem == "truncated" and not len(starts):
        raise TraceFormatError(path, "no complete Perfetto packet: the file is cut short before "
                               "its first packet ends, or it is not a trace", 0)
    if problem == "truncated":
        msg = (f"{path}: the trace ends inside a packet at byte {position} (was the recording "
               f"killed?); loaded the {len(starts)} complete packets")
        warnings.warn(msg, TruncatedTraceWarning, stacklevel=3)
        warn.append(msg)
    try:
        return _decode(path, data, buf, starts, ends, warn)
    except WireError as exc:
        raise TraceFormatError(path, f"corrupt packet: {exc.reason}", exc.position) from None


def _decode(path: str, data: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            warn: list[str]) -> RawTrace:
    skipped: Counter[str] = Counter()
    n = len(starts)
    pk = scan(buf, starts, ends, PACKET_SLOTS, set(), offsets={4})
    for number, count in Counter(pk.others[~np.isin(pk.others, list(IGNORED_PACKET_FIELDS))]
                                 .tolist()).items():
        skipped[f"packet field {number}"] += count
    late = np.flatnonzero(pk.value[0] >= np.uint64(1 << 63))
    if len(late):
        raise TraceFormatError(path, f"packet timestamp {int(pk.value[0][late[0]])} ns is past "
                               "what 64-bit signed times hold", int(starts[late[0]]))
    p_ts = pk.value[0].astype(np.int64)
    p_seq = pk.value[1].astype(np.int64)
    cleared = ((pk.value[2] & np.uint64(SEQ_INCREMENTAL_STATE_CLEARED)) != 0) | (pk.value[3] != 0)
    # generation of incremental state per packet, within its sequence
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
    # packets with descriptors, interning or defaults: parse them one by one, in order
    state = _State()
    for i in np.flatnonzero(pk.field[5] != 0).tolist():
        state.read(data, int(starts[i]), int(ends[i]), int(p_seq[i]), int(p_gen[i]))
    # track events
    ev_pkt = np.flatnonzero(pk.field[4] != 0)
    ev_off = pk.offset[4][ev_pkt]
    ev_len = pk.value[4][ev_pkt].astype(np.int64)
    del pk
    ne = len(ev_pkt)
    es = scan(buf, ev_off, ev_off + ev_len, EVENT_SLOTS, EVENT_REPEATED, offsets={3})
    ef = es.rows
    ev_ts = p_ts[ev_pkt]
    ev_seqgen = p_pair[ev_pkt].astype(np.int64)
    ev_type = es.value[0].astype(np.int64)
    ev_track_uuid = es.value[2].copy()
    has_track = es.field[2] != 0
    if (~has_track).any():
        seq_default = np.array([state.default_track.get(int(s), 0)
                                for s in p_seq[ev_pkt[~has_track]].tolist()], np.uint64)
        ev_track_uuid[~has_track] = seq_default
    # names: interned or inline
    ev_name = _EventTexts(ne)
    m = np.flatnonzero(es.field[1] == E_NAME_IID)
    ev_name.put(m, *_resolve_codes(state, "name", ev_seqgen[m], es.value[1][m], pairs, ""))
    m = np.flatnonzero(es.field[3] == E_NAME)
    ev_name.put_strings(m, _strings(data, es.offset[3][m], es.value[3][m]))
    # categories: the first one
    ev_cat = _EventTexts(ne)
    m, _, v, _ = ef.select(E_CATEGORY_IIDS)
    _, first = np.unique(m, return_index=True)  # rows come in file order: first = earliest
    ev_cat.put(m[first], *_resolve_codes(state, "cat", ev_seqgen[m[first]], v[first], pairs, ""))
    m, _, v, o = ef.select(E_CATEGORIES)
    _, first = np.unique(m, return_index=True)
    ev_cat.put_strings(m[first], _strings(data, o[first], v[first]))
    known = (ev_type >= TYPE_BEGIN) & (ev_type <= TYPE_COUNTER)
    for t, count in Counter(ev_type[~known].tolist()).items():
        skipped[f"track event type {t}"] += count
    tracks, track_of = _tracks(state, np.sort(pd.unique(ev_track_uuid)))
    uuid_list = np.array(list(track_of), np.uint64)
    track_ids = np.array(list(track_of.values()), np.int64)
    sorter = np.argsort(uuid_list)
    ev_track = track_ids[sorter][np.searchsorted(uuid_list[sorter], ev_track_uuid)] if ne else \
        np.zeros(0, np.int64)
    # slices: begin/end pairs and instants
    is_be = (ev_type == TYPE_BEGIN) | (ev_type == TYPE_END)
    be_idx = np.flatnonzero(is_be)
    b_local, e_local, depth, parent = match_begin_end(ev_track[be_idx], ev_type[be_idx] == 1,
                                                     ev_ts[be_idx])
    b_ev = be_idx[b_local]
    e_ev = np.where(e_local >= 0, be_idx[np.maximum(e_local, 0)], -1)
    dropped_ends = int((ev_type == TYPE_END).sum()) - int((e_local >= 0).sum())
    if dropped_ends:
        skipped["slice end without begin"] += dropped_ends
    trace_end = int(ev_ts.max()) if ne else 0
    unfinished = e_ev < 0
    if unfinished.any():
        skipped["slice never ended (closed at trace end)"] += int(unfinished.sum())
    b_dur = np.where(unfinished, trace_end - ev_ts[b_ev], ev_ts[np.maximum(e_ev, 0)] - ev_ts[b_ev])
    inst_ev = np.flatnonzero(ev_type == TYPE_INSTANT)
    slice_ev = np.r_[b_ev, inst_ev]
    s_track = ev_track[slice_ev]
    s_ts = ev_ts[slice_ev]
    s_dur = np.r_[b_dur, np.zeros(len(inst_ev), np.int64)]
    s_depth = np.r_[depth, np.zeros(len(inst_ev), np.int64)]
    s_parent = np.r_[parent, np.full(len(inst_ev), -1, np.int64)]
    if len(inst_ev) and len(b_ev):
        # an instant's parent: the deepest slice holding it, among its tracks' slices only
        near = np.flatnonzero(np.isin(ev_track[b_ev], np.unique(ev_track[inst_ev])))
        pre = pd.DataFrame({"id": np.arange(len(b_ev)), "ts": ev_ts[b_ev], "dur": b_dur,
                            "track_id": ev_track[b_ev], "depth": depth, "parent_id": parent}
                           ).iloc[near]
        host = bind_flow_points(pre, ev_track[inst_ev], ev_ts[inst_ev],
                                np.ones(len(inst_ev), bool), parent_of=parent, begin_ts=ev_ts[b_ev],
                                begin_end=ev_ts[b_ev] + b_dur)
        ok = host >= 0
        s_parent[len(b_ev):][ok] = host[ok]
        s_depth[len(b_ev):][ok] = depth[host[ok]] + 1
    slice_cat = ev_cat.codes[slice_ev]
    slices, order = build_slices(s_track, s_ts, s_dur, ev_name.column(slice_ev),
                                 ev_cat.column(slice_ev), ev_cat.mapped(slice_ev, our_kind),
                                 s_depth, s_parent)
    slice_of_event = np.full(ne, -1, np.int64)
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    slice_of_event[slice_ev] = new_id
    slice_of_event[e_ev[e_ev >= 0]] = new_id[: len(b_ev)][e_ev >= 0]
    counters = _counters(es, ev_type, ev_ts, ev_track, tracks)
    state.pairs = pairs
    ann = Annotations.of(ef, slice_of_event)
    n_slices = len(slices)
    # args are decoded on first use; the metadata instant's now (the hardware figures)
    meta_codes = [i for i, c in enumerate(ev_cat.values) if c == tf.CAT_METADATA]
    meta_ids = np.sort(new_id[np.isin(slice_cat, meta_codes)])
    meta_args = decode_annotations(data, buf, ann.subset(np.isin(ann.sid, meta_ids)), ev_seqgen,
                                   state, n_slices)
    metadata = check(path, _metadata(meta_ids, meta_args))
    skipped_now = dict(skipped)

    def dropped(count: int, position: int) -> None:  # heard when the args are first decoded
        msg = (f"{path}: {count} debug annotations (slice args) are corrupt, the first at "
               f"byte {position}; they were left out")
        warnings.warn(msg, TraceFormatWarning, stacklevel=2)
        warn.append(msg)
        skipped_now["corrupt debug annotation"] = count

    args = LazyArgs(lambda: decode_annotations(data, buf, ann, ev_seqgen, state, n_slices,
                                               dropped))
    # flows are linked on first use: the overview does not need them
    return RawTrace(path=path, source_format="pftrace", slices=slices, args=args,
                    tracks=tracks, counters=counters,
                    flows=lambda: _flows(ef, ev_ts, slice_of_event), metadata=metadata,
                    skipped=skipped_now, warnings=warn)


def _counters(es: Scan, ev_type: np.ndarray, ev_ts: np.ndarray, ev_track: np.ndarray,
              tracks: pd.DataFrame) -> pd.DataFrame:
    idx = np.flatnonzero(ev_type == TYPE_COUNTER)
    raw = es.value[4][idx]
    value = np.where(es.field[4][idx] == E_COUNTER_DOUBLE, raw.view(np.float64),
                     raw.view(np.int64).astype(np.float64))
    names = tracks.set_index("track_id")["name"]
    frame = pd.DataFrame({"ts": ev_ts[idx], "value": value, "track_id": ev_track[idx]},
                         columns=COUNTER_COLUMNS[:3])
    frame["name"] = names.reindex(frame["track_id"]).to_numpy()
    return frame.sort_values(["track_id", "ts"], kind="stable", ignore_index=True)


def _flows(ef: Any, ev_ts: np.ndarray, slice_of_event: np.ndarray) -> pd.DataFrame:
    """Flow edges: consecutive events carrying the same flow id, cut after a terminating one."""
    parts = []
    for field, terminating in ((E_FLOW, False), (E_FLOW_OLD, False), (E_TERM_FLOW, True),
                               (E_TERM_FLOW_OLD, True)):
        m, _, v, _ = ef.select(field)
        parts.append((v.view(np.int64), m, np.full(len(m), terminating)))
    fid = np.concatenate([p[0] for p in parts])
    ev = np.concatenate([p[1] for p in parts])
    term = np.concatenate([p[2] for p in parts])
    sid = slice_of_event[ev] if len(ev) else np.zeros(0, np.int64)
    keep = sid >= 0
    fid, ev, term, sid = fid[keep], ev[keep], term[keep], sid[keep]
    order = np.lexsort((ev, ev_ts[ev] if len(ev) else ev, fid))
    fid, term, sid = fid[order], term[order], sid[order]
    link = (fid[1:] == fid[:-1]) & ~term[:-1] & (sid[1:] != sid[:-1])
    return pd.DataFrame({"flow_id": fid[1:][link], "src_id": sid[:-1][link],
                         "dst_id": sid[1:][link]}, columns=FLOW_COLUMNS).astype("int64")


def _metadata(ids: np.ndarray, args: ColumnArgs) -> dict[str, Any]:
    """The trace's metadata: the JSON args of its metadata slices (ids), merged in order."""
    meta: dict[str, Any] = {}
    for text in args.column(tf.ARG_METADATA_JSON, ids).tolist():
        merge_json(meta, text)
    return meta
