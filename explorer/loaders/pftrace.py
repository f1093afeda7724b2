"""Perfetto protobuf traces (`.pftrace`, TrackEvent), read with vectorised wire scanning.

Packets that only carry track events (nearly all of them) are decoded column-wise
by `wire_scan`; the few that describe tracks, intern names or set defaults are
parsed one by one with Perfetto's own protobuf classes. Interned names are kept
per packet sequence and per incremental-state generation, as Perfetto defines.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer import trace_format as tf
from neuron_explorer.errors import TraceFormatError
from neuron_explorer.loaders.args import ColumnArgs
from neuron_explorer.loaders.chrome_json import bind_flow_points
from neuron_explorer.loaders.kinds import DEVICE_PROCESS_NAME, our_kind
from neuron_explorer.loaders.nesting import match_begin_end
from neuron_explorer.loaders.pftrace_annotations import decode_annotations
from neuron_explorer.loaders.raw import COUNTER_COLUMNS, FLOW_COLUMNS, RawTrace, build_slices
from neuron_explorer.loaders.track_kinds import device_track_kind
from neuron_explorer.loaders.wire_scan import WireError, packet_offsets, scan_fields

# TracePacket fields
P_TIMESTAMP, P_TRACK_EVENT, P_SEQ_ID, P_INTERNED, P_FLAGS = 8, 11, 10, 12, 13
P_CLEARED, P_DEFAULTS, P_DESCRIPTOR = 41, 59, 60
SEQ_INCREMENTAL_STATE_CLEARED = 1
# TrackEvent fields
E_CATEGORY_IIDS, E_ANNOTATION, E_TYPE, E_NAME_IID, E_TRACK = 3, 4, 9, 10, 11
E_CATEGORIES, E_NAME, E_COUNTER_INT, E_COUNTER_DOUBLE = 22, 23, 30, 44
E_FLOW_OLD, E_TERM_FLOW_OLD, E_FLOW, E_TERM_FLOW = 36, 42, 47, 48
TYPE_BEGIN, TYPE_END, TYPE_INSTANT, TYPE_COUNTER = 1, 2, 3, 4
KNOWN_PACKET_FIELDS = {P_TIMESTAMP, P_TRACK_EVENT, P_SEQ_ID, P_INTERNED, P_FLAGS, P_CLEARED,
                       P_DEFAULTS, P_DESCRIPTOR, 58, 87, 42}


class TruncatedTraceWarning(UserWarning):
    """The trace ends inside a packet (the recording was killed); the rest was loaded."""


def _first(n: int, msg: np.ndarray, values: np.ndarray, fill: Any, dtype: Any) -> np.ndarray:
    """Per message, the last value of a scalar field (fill where absent)."""
    out = np.full(n, fill, dtype=dtype)
    out[msg] = values
    return out


def _pb2():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2


class _State:
    """Interned names, track descriptors and defaults, gathered packet by packet."""

    def __init__(self) -> None:
        self.interned: dict[tuple[int, int, str], dict[int, str]] = {}
        self.descriptors: dict[int, Any] = {}
        self.default_track: dict[int, int] = {}

    def table(self, seq: int, gen: int, kind: str) -> dict[int, str]:
        return self.interned.setdefault((seq, gen, kind), {})

    def read(self, packet: Any, seq: int, gen: int) -> None:
        if packet.HasField("interned_data"):
            data = packet.interned_data
            for kind, items, attr in (
                ("cat", data.event_categories, "name"),
                ("name", data.event_names, "name"),
                ("ann", data.debug_annotation_names, "name"),
                ("str", data.debug_annotation_string_values, "str"),
            ):
                table = self.table(seq, gen, kind)
                for item in items:
                    value = getattr(item, attr)
                    table[item.iid] = value.decode("utf-8", "replace") if isinstance(
                        value, bytes) else value
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            self.descriptors[d.uuid] = d
        if packet.HasField("trace_packet_defaults"):
            defaults = packet.trace_packet_defaults.track_event_defaults
            if defaults.HasField("track_uuid"):
                self.default_track[seq] = defaults.track_uuid


def _resolve(state: _State, kind: str, seqgen: np.ndarray, keys: np.ndarray,
             seqgen_pairs: list[tuple[int, int]]) -> np.ndarray:
    """Interned iids -> strings, looked up once per distinct (sequence, generation, iid)."""
    out = np.empty(len(keys), object)
    if not len(keys):
        return out
    combo = seqgen.astype(np.int64) * (1 << 40) + keys.astype(np.int64)
    uniq, inverse = np.unique(combo, return_inverse=True)
    names = []
    for c in uniq.tolist():
        sg, iid = divmod(c, 1 << 40)
        seq, gen = seqgen_pairs[sg]
        names.append(state.interned.get((seq, gen, kind), {}).get(iid))
    out[:] = np.asarray(names, object)[inverse]
    return out


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
        if d.HasField("process"):
            proc_by_pid[d.process.pid] = d.process.process_name or d.name or str(d.process.pid)

    def process_of(d: Any, depth: int = 0) -> tuple[str, int]:
        if d.HasField("process"):
            return proc_by_pid.get(d.process.pid, d.name), d.process.pid
        if d.HasField("thread"):
            return proc_by_pid.get(d.thread.pid, str(d.thread.pid)), d.thread.pid
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
        name = d.name or d.static_name
        tid = d.thread.tid if d.HasField("thread") else -1
        if d.HasField("thread"):
            name = d.thread.thread_name or name or f"thread {tid}"
        elif d.HasField("process"):
            name = name or pname
        ours = DEVICE_PROCESS_NAME.match(pname)
        device = int(ours.group(1)) if ours else -1
        if d.HasField("counter"):
            kind = "counter"
        elif ours:
            kind = device_track_kind(name)
        elif d.HasField("process"):
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
    pf = scan_fields(buf, starts, ends)
    for number, count in Counter(pf.field[~np.isin(pf.field, list(KNOWN_PACKET_FIELDS))]
                                 .tolist()).items():
        skipped[f"packet field {number}"] += count
    m, _, v, _ = pf.select(P_TIMESTAMP)
    p_ts = _first(n, m, v.astype(np.int64), 0, np.int64)
    m, _, v, _ = pf.select(P_SEQ_ID)
    p_seq = _first(n, m, v.astype(np.int64), 0, np.int64)
    m, _, v, _ = pf.select(P_FLAGS)
    cleared = np.zeros(n, bool)
    cleared[m] = (v & np.uint64(SEQ_INCREMENTAL_STATE_CLEARED)) != 0
    m, _, v, _ = pf.select(P_CLEARED)
    cleared[m[v != 0]] = True
    # generation of incremental state per packet, within its sequence
    p_gen = np.zeros(n, np.int64)
    for seq in np.unique(p_seq).tolist():
        idx = np.flatnonzero(p_seq == seq)
        p_gen[idx] = np.cumsum(cleared[idx])
    pairs = sorted(set(zip(p_seq.tolist(), p_gen.tolist(), strict=True))) if n else []
    pair_id = {p: i for i, p in enumerate(pairs)}
    # packets with descriptors, interning or defaults: parse them fully, in order
    special = np.unique(pf.msg[np.isin(pf.field, [P_INTERNED, P_DESCRIPTOR, P_DEFAULTS])])
    state = _State()
    if len(special):
        trace_packet = _pb2().TracePacket
        for i in special.tolist():
            packet = trace_packet.FromString(data[int(starts[i]):int(ends[i])])
            state.read(packet, int(p_seq[i]), int(p_gen[i]))
    # track events
    ev_pkt, _, ev_len, ev_off = pf.select(P_TRACK_EVENT)
    ne = len(ev_pkt)
    ef = scan_fields(buf, ev_off, ev_off + ev_len.astype(np.int64))
    ev_ts = p_ts[ev_pkt]
    ev_seqgen = np.asarray([pair_id[(s, g)] for s, g in zip(p_seq[ev_pkt].tolist(),
                           p_gen[ev_pkt].tolist(), strict=True)], np.int64) if ne else \
        np.zeros(0, np.int64)
    m, _, v, _ = ef.select(E_TYPE)
    ev_type = _first(ne, m, v.astype(np.int64), 0, np.int64)
    m, _, v, _ = ef.select(E_TRACK)
    ev_track_uuid = _first(ne, m, v, 0, np.uint64)
    has_track = np.zeros(ne, bool)
    has_track[m] = True
    if (~has_track).any():
        seq_default = np.array([state.default_track.get(int(s), 0)
                                for s in p_seq[ev_pkt[~has_track]].tolist()], np.uint64)
        ev_track_uuid[~has_track] = seq_default
    # names: interned or inline
    ev_name = np.full(ne, "", object)
    m, _, v, _ = ef.select(E_NAME_IID)
    ev_name[m] = _resolve(state, "name", ev_seqgen[m], v, pairs)
    m, _, v, o = ef.select(E_NAME)
    ev_name[m] = _strings(data, o, v)
    # categories: the first one
    ev_cat = np.full(ne, "", object)
    m, _, v, _ = ef.select(E_CATEGORY_IIDS)
    first = np.r_[True, m[1:] != m[:-1]] if len(m) else np.zeros(0, bool)
    ev_cat[m[first]] = _resolve(state, "cat", ev_seqgen[m[first]], v[first], pairs)
    m, _, v, o = ef.select(E_CATEGORIES)
    first = np.r_[True, m[1:] != m[:-1]] if len(m) else np.zeros(0, bool)
    ev_cat[m[first]] = _strings(data, o[first], v[first])
    ev_name[pd.isna(ev_name)] = ""
    ev_cat[pd.isna(ev_cat)] = ""
    for t, count in Counter(ev_type[~np.isin(ev_type, [1, 2, 3, 4])].tolist()).items():
        skipped[f"track event type {t}"] += count
    tracks, track_of = _tracks(state, np.unique(ev_track_uuid))
    uuid_list = np.array(list(track_of), np.uint64)
    track_ids = np.array(list(track_of.values()), np.int64)
    sorter = np.argsort(uuid_list)
    ev_track = track_ids[sorter][np.searchsorted(uuid_list[sorter], ev_track_uuid)] if ne else \
        np.zeros(0, np.int64)
    # slices: begin/end pairs and instants
    is_be = np.isin(ev_type, [TYPE_BEGIN, TYPE_END])
    be_idx = np.flatnonzero(is_be)
    b_local, e_local, depth, parent = match_begin_end(ev_track[be_idx], ev_type[be_idx] == 1)
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
        pre, pre_order = build_slices(ev_track[b_ev], ev_ts[b_ev], b_dur, ev_name[b_ev],
                                      ev_cat[b_ev], ev_cat[b_ev], depth, parent)
        host = bind_flow_points(pre, ev_track[inst_ev], ev_ts[inst_ev],
                                np.ones(len(inst_ev), bool))
        ok = host >= 0
        s_parent[len(b_ev):][ok] = pre_order[host[ok]]
        s_depth[len(b_ev):][ok] = pre["depth"].to_numpy()[host[ok]] + 1
    kinds = np.asarray([our_kind(c) for c in ev_cat[slice_ev].tolist()], object)
    slices, order = build_slices(s_track, s_ts, s_dur, ev_name[slice_ev], ev_cat[slice_ev],
                                 kinds, s_depth, s_parent)
    slice_of_event = np.full(ne, -1, np.int64)
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    slice_of_event[slice_ev] = new_id
    slice_of_event[e_ev[e_ev >= 0]] = new_id[: len(b_ev)][e_ev >= 0]
    counters = _counters(ef, ne, ev_type, ev_ts, ev_track, tracks, buf)
    flows = _flows(ef, ev_ts, slice_of_event)
    long = decode_annotations(data, buf, ef, slice_of_event, ev_seqgen, state, pairs, _resolve)
    args = ColumnArgs(long, len(slices))
    metadata = _metadata(slices, args)
    return RawTrace(path=path, source_format="pftrace", slices=slices, args=args,
                    tracks=tracks, counters=counters, flows=flows, metadata=metadata,
                    skipped=dict(skipped), warnings=warn)


def _counters(ef: Any, ne: int, ev_type: np.ndarray, ev_ts: np.ndarray, ev_track: np.ndarray,
              tracks: pd.DataFrame, buf: np.ndarray) -> pd.DataFrame:
    value = np.full(ne, np.nan)
    m, _, v, _ = ef.select(E_COUNTER_INT)
    value[m] = v.view(np.int64).astype(np.float64)
    m, _, v, _ = ef.select(E_COUNTER_DOUBLE)
    value[m] = v.view(np.float64)
    idx = np.flatnonzero(ev_type == TYPE_COUNTER)
    names = tracks.set_index("track_id")["name"]
    frame = pd.DataFrame({"ts": ev_ts[idx], "value": value[idx], "track_id": ev_track[idx]},
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


def _metadata(slices: pd.DataFrame, args: ColumnArgs) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    ids = slices["id"].to_numpy()[slices["category"].to_numpy() == tf.CAT_METADATA]
    for text in args.column(tf.ARG_METADATA_JSON, ids).tolist():
        if isinstance(text, str):
            try:
                meta.update(json.loads(text))
            except ValueError:
                pass
    return meta
