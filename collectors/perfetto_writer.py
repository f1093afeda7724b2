"""Streams a Perfetto protobuf trace (`.pftrace`) to disk, encoding wire bytes by hand.

Interface (shared with `JsonWriter`; see `trace_writer` for an example):
`process(pid, name, cmdline)`, `thread(pid, tid, name)`, `track(name, process)`,
`counter_track(name, process, unit)` register tracks and return handles (track
uuids); `slice`, `begin`/`end`, `instant`, `counter` write one event; `slices` and
`counters` write numpy batches; `metadata` writes the run's metadata instant;
`flush`, `close`, `discard`.

Encoding, as Perfetto's TrackEvent docs require: one packet sequence
(`trusted_packet_sequence_id`), the first packet flagged
SEQ_INCREMENTAL_STATE_CLEARED and every later one SEQ_NEEDS_INCREMENTAL_STATE;
event names, categories, debug-annotation names and the string values of batched
slices are interned (their `InternedData` rides on the packet that first uses them, or
on a packet of its own before a batch); slices are SLICE_BEGIN/SLICE_END pairs, written
in time order per track, so at equal timestamps file order says which slice encloses which;
flows use `flow_ids` / `terminating_flow_ids`. Packets are buffered and written in
chunks of whole packets, so a killed run leaves a readable prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from neuron_explorer.collectors import wire
from neuron_explorer.collectors.chunked_output import ChunkedOutput
from neuron_explorer.common import perfetto_fields as F
from neuron_explorer.common.trace_format import ARG_METADATA_JSON, CAT_METADATA

_TRACE_PACKET = 1  # Trace.packet
_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4
# `type = SLICE_BEGIN` again, as long as a flow id field (tag + fixed64): pads batch rows
# that have no flow, leaving the parsed message unchanged
_FLOW_WIDTH = len(wire.tag(F.E_FLOW_IDS, wire.FIXED64)) + 8
_NO_FLOW = wire.tag(F.E_TYPE, wire.VARINT) + wire.padded_varint(_BEGIN, _FLOW_WIDTH - 1)
_CLEARED, _NEEDS = 1, 2
_CACHE_LIMIT = 100_000  # encoded (key, value) annotations kept for reuse
_SMALL = [bytes((i,)) for i in range(128)]


def _annotation_value(value: Any) -> bytes:
    """The value part of a DebugAnnotation."""
    if isinstance(value, bool):
        return wire.field_varint(2, int(value))
    if isinstance(value, int):
        return wire.field_varint(4, value)
    if isinstance(value, float):
        return wire.field_double(5, value)
    return wire.field_bytes(6, str(value).encode())


class PerfettoWriter(ChunkedOutput):
    """Writes TrackEvent packets to `path`, buffered in chunks of about `chunk_bytes`."""

    def __init__(
        self, path: str, *, chunk_bytes: int = 1 << 20, sequence_id: int = 1, uuid_base: int = 1,
        create_on_write: bool = False,
    ) -> None:
        super().__init__(path, chunk_bytes, create_on_write)
        self.events = 0
        self.counts: dict[str, int] = {}
        self._seq = wire.field_varint(F.P_SEQ_ID, sequence_id)
        self._seq_needs = self._seq + wire.field_varint(F.P_FLAGS, _NEEDS)
        self._first = True
        self._next_uuid = uuid_base
        self._interned: dict[tuple[int, str], int] = {}
        self._next_iid = {F.I_CATEGORIES: 1, F.I_NAMES: 1, F.I_ANNOTATION_NAMES: 1,
                          F.I_DEBUG_ANNOTATION_STRING_VALUES: 1}
        self._pending_interned: list[bytes] = []
        self._headers: dict[tuple[int, int, str, str], bytes] = {}
        self._end_headers: dict[int, bytes] = {}
        self._string_tables: dict[tuple, list[bytes]] = {}
        self._annotations: dict[tuple[str, Any, type], bytes] = {}
        self._annotation_names: dict[str, list[bytes]] = {}
        self._counter_headers: dict[int, bytes] = {}

    # -- tracks ---------------------------------------------------------------

    # Descriptors are encoded by hand too: importing perfetto's generated protos costs
    # about 0.2 s, which a short recorded run would notice.

    def _descriptor(self, fields: bytes) -> int:
        uuid = self._next_uuid
        self._next_uuid += 1
        desc = wire.field_varint(F.D_UUID, uuid) + fields
        self._packet(wire.field_bytes(F.P_TRACK_DESCRIPTOR, desc))
        return uuid

    def process(self, pid: int, name: str, cmdline: Sequence[str] = ()) -> int:
        body = wire.field_varint(1, pid)
        for arg in cmdline:
            body += wire.field_bytes(2, str(arg).encode())
        body += wire.field_bytes(6, name.encode())
        return self._descriptor(wire.field_bytes(F.D_PROCESS, body))

    def thread(self, pid: int, tid: int, name: str) -> int:
        body = wire.field_varint(1, pid) + wire.field_varint(2, tid)
        body += wire.field_bytes(5, name.encode())
        return self._descriptor(wire.field_bytes(F.D_THREAD, body))

    def track(self, name: str, process: int) -> int:
        return self._descriptor(wire.field_varint(F.D_PARENT, process)
                                + wire.field_bytes(F.D_NAME, name.encode()))

    def counter_track(self, name: str, process: int, unit: str | None = None) -> int:
        if unit == "bytes":
            counter = wire.field_varint(3, F.UNIT_SIZE_BYTES)
        elif unit:
            counter = wire.field_bytes(6, unit.encode())
        else:
            counter = b""
        return self._descriptor(wire.field_varint(F.D_PARENT, process)
                                + wire.field_bytes(F.D_NAME, name.encode())
                                + wire.field_bytes(F.D_COUNTER, counter))

    # -- interning --------------------------------------------------------------

    def _iid(self, kind: int, text: str) -> int:
        key = (kind, text)
        iid = self._interned.get(key)
        if iid is None:
            iid = self._next_iid[kind]
            self._next_iid[kind] = iid + 1
            self._interned[key] = iid
            entry = wire.field_varint(1, iid) + wire.field_bytes(2, text.encode())
            self._pending_interned.append(wire.field_bytes(kind, entry))
        return iid

    def _take_interned(self) -> bytes:
        if not self._pending_interned:
            return b""
        data = b"".join(self._pending_interned)
        self._pending_interned.clear()
        return wire.field_bytes(F.P_INTERNED, data)

    # -- packets --------------------------------------------------------------

    def _packet(self, body: bytes) -> None:
        if self._first:
            self._first = False
            body += self._seq + wire.field_varint(F.P_FLAGS, _CLEARED)
            body += wire.field_varint(F.P_FIRST_ON_SEQUENCE, 1)
        else:
            body += self._seq_needs
        self._emit(b"\x0a" + wire.varint(len(body)) + body)

    def _start_sequence(self) -> None:
        """Batches carry the NEEDS flag: make sure a CLEARED packet came first."""
        if self._first:
            self._packet(b"")

    def _event(self, ts: int, event: bytes) -> None:
        """One TrackEvent packet; the hot path, so the packet is assembled inline."""
        if self._pending_interned or self._first:
            self._packet(b"\x40" + wire.varint(ts) + b"\x5a" + wire.varint(len(event)) + event
                         + self._take_interned())
            return
        body = b"\x40" + wire.varint(ts) + b"\x5a" + wire.varint(len(event)) + event
        body += self._seq_needs
        data = b"\x0a" + wire.varint(len(body)) + body
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered >= self._chunk_bytes:
            self.flush()

    def _header(self, kind: int, track: int, name: str, category: str) -> bytes:
        key = (kind, track, name, category)
        head = self._headers.get(key)
        if head is None:
            head = (
                wire.field_varint(F.E_TYPE, kind)
                + wire.field_varint(F.E_TRACK, track)
                + wire.field_varint(F.E_CATEGORY_IIDS, self._iid(F.I_CATEGORIES, category))
                + wire.field_varint(F.E_NAME_IID, self._iid(F.I_NAMES, name))
            )
            self._headers[key] = head
        return head

    def _int_prefixes(self, key: str) -> list[bytes]:
        """An int annotation's bytes before its value, one per value width (1-10 bytes)."""
        name = b"\x08" + wire.varint(self._iid(F.I_ANNOTATION_NAMES, key)) + b"\x20"
        prefixes = [b""] + [b"\x22" + _SMALL[len(name) + width] + name for width in range(1, 11)]
        self._annotation_names[key] = prefixes
        return prefixes

    def _args(self, args: Mapping[str, Any]) -> bytes:
        cache = self._annotations
        names = self._annotation_names
        varint = wire.varint
        parts: list[bytes] = []
        for key, value in args.items():
            if type(value) is int:  # ids and steps: encoded directly, not cached
                enc = varint(value)
                parts += ((names.get(key) or self._int_prefixes(key))[len(enc)], enc)
                continue
            ck = (key, value, type(value))
            cached = cache.get(ck)
            if cached is None:
                if len(cache) > _CACHE_LIMIT:
                    cache.clear()
                inner = wire.field_varint(1, self._iid(F.I_ANNOTATION_NAMES, key))
                cached = cache[ck] = wire.field_bytes(F.E_DEBUG, inner + _annotation_value(value))
            parts.append(cached)
        return b"".join(parts)

    @staticmethod
    def _flows(flow_out: Sequence[int], flow_in: Sequence[int]) -> bytes:
        out = b""
        for fid in flow_out:
            out += wire.field_fixed64(F.E_FLOW_IDS, fid)
        for fid in flow_in:
            out += wire.field_fixed64(F.E_TERMINATING_FLOW_IDS, fid)
        return out

    def _count(self, category: str) -> None:
        self.events += 1
        self.counts[category] = self.counts.get(category, 0) + 1

    # -- events -------------------------------------------------------------------

    def prepare_args(self, args: Mapping[str, Any]) -> bytes:
        """Encode args once for reuse with `prepared=` (ops of the same signature repeat)."""
        return self._args(args)

    def begin(
        self,
        track: int,
        ts: int,
        name: str,
        category: str,
        args: Mapping[str, Any] | None = None,
        flow_out: Sequence[int] = (),
        flow_in: Sequence[int] = (),
        prepared: bytes | None = None,
    ) -> None:
        event = self._header(_BEGIN, track, name, category)
        if prepared:
            event += prepared
        if args:
            event += self._args(args)
        if flow_out or flow_in:
            event += self._flows(flow_out, flow_in)
        self._event(ts, event)
        self._count(category)

    def end(self, track: int, ts: int) -> None:
        head = self._end_headers.get(track)
        if head is None:
            head = wire.field_varint(F.E_TYPE, _END) + wire.field_varint(F.E_TRACK, track)
            self._end_headers[track] = head
        self._event(ts, head)

    def slice(
        self,
        track: int,
        ts: int,
        dur: int,
        name: str,
        category: str,
        args: Mapping[str, Any] | None = None,
        flow_out: Sequence[int] = (),
        flow_in: Sequence[int] = (),
        prepared: bytes | None = None,
    ) -> None:
        """A complete slice: its BEGIN and END packets (ops, kernels and instructions go
        through `slices`; this serves the rarer host slices such as syncs)."""
        self.begin(track, ts, name, category, args, flow_out, flow_in, prepared)
        self.end(track, ts + max(dur, 0))

    def instant(
        self, track: int, ts: int, name: str, category: str, args: Mapping[str, Any] | None = None
    ) -> None:
        event = self._header(_INSTANT, track, name, category)
        if args:
            event += self._args(args)
        self._event(ts, event)
        self._count(category)

    def counter(self, track: int, ts: int, value: float) -> None:
        head = self._counter_headers.get(track)
        if head is None:
            head = wire.field_varint(F.E_TYPE, _COUNTER) + wire.field_varint(F.E_TRACK, track)
            self._counter_headers[track] = head
        if isinstance(value, float):
            event = head + wire.field_double(F.E_DOUBLE_COUNTER, value)
        else:
            event = head + wire.field_varint(F.E_COUNTER, int(value))
        self._event(ts, event)
        self._count("counter")

    def metadata(self, track: int, ts: int, meta: Mapping[str, Any]) -> None:
        self.instant(track, ts, CAT_METADATA, CAT_METADATA,
                     {ARG_METADATA_JSON: json.dumps(meta, sort_keys=True, default=str)})

    # -- batches ------------------------------------------------------------------

    def slices(
        self,
        tracks: np.ndarray,
        ts: np.ndarray,
        dur: np.ndarray,
        names: Sequence[str],
        name_index: np.ndarray,
        category: str,
        int_args: Mapping[str, np.ndarray | tuple[np.ndarray, np.ndarray]] | None = None,
        str_args: Mapping[str, tuple[Sequence[str], np.ndarray]] | None = None,
        flow_out: np.ndarray | None = None,
        flow_in: np.ndarray | None = None,
        prepared: tuple[Sequence[bytes], np.ndarray] | None = None,
    ) -> None:
        """Write N complete slices at once, in row order. An int arg is an array, or
        (array, present) to leave it out of some rows. Flow ids: one per row (N,) or
        several (N, k), 0 meaning none; `prepared`: (args from `prepare_args`, the one
        each row uses)."""
        n = len(ts)
        if n == 0:
            return
        ts = np.asarray(ts, np.int64)
        name_iids = np.array([self._iid(F.I_NAMES, s) for s in names], np.int64)
        head = wire.field_varint(F.E_CATEGORY_IIDS, self._iid(F.I_CATEGORIES, category))
        track_seg = [wire.const(wire.tag(F.E_TRACK, wire.VARINT), n),
                     wire.varints(np.asarray(tracks, np.int64))]
        body = [
            wire.const(wire.field_varint(F.E_TYPE, _BEGIN), n),
            *track_seg,
            wire.const(head + wire.tag(F.E_NAME_IID, wire.VARINT), n),
            wire.varints(name_iids[np.asarray(name_index, np.int64)]),
        ]
        for key, values in (int_args or {}).items():
            present = None
            if isinstance(values, tuple):  # (values, present): absent where present is False
                values, present = values[0], np.asarray(values[1], bool)
                values = np.where(present, values, 0)  # an absent value must not widen the rest
            name_part = wire.field_varint(1, self._iid(F.I_ANNOTATION_NAMES, key))
            annotation = wire.message(F.E_DEBUG, [
                wire.const(name_part + wire.tag(4, wire.VARINT), n),
                wire.varints(np.asarray(values, np.int64)),
            ])
            body += annotation if present is None else wire.optional(annotation, present)
        for key, (choices, index) in (str_args or {}).items():
            body.append(wire.table(self._string_annotations(key, choices), index))
        if prepared is not None:
            body.append(wire.spliced(list(prepared[0]), prepared[1]))
        for field, ids in ((F.E_FLOW_IDS, flow_out), (F.E_TERMINATING_FLOW_IDS, flow_in)):
            if ids is None:
                continue
            ids = np.asarray(ids, np.uint64).reshape(n, -1)
            for column in ids.T:
                flow = wire.concat_columns([wire.const(wire.tag(field, wire.FIXED64), n),
                                            wire.fixed64s(np.ascontiguousarray(column))])
                # rows without a flow repeat `type` instead (same width, same message)
                body.append(wire.choose(column != 0, flow, _NO_FLOW))
        interned = self._take_interned()
        if interned or self._first:
            self._packet(interned)
        trailer = wire.const(self._seq_needs, n)
        stamp = wire.const(wire.tag(F.P_TIMESTAMP, wire.VARINT), n)
        begin = wire.message(_TRACE_PACKET, [
            stamp, wire.varints(ts), *wire.message(F.P_TRACK_EVENT, body), trailer,
        ])
        end_event = [wire.const(wire.field_varint(F.E_TYPE, _END), n), *track_seg]
        end = wire.message(_TRACE_PACKET, [
            stamp, wire.varints(ts + np.maximum(np.asarray(dur, np.int64), 0)),
            *wire.message(F.P_TRACK_EVENT, end_event), trailer,
        ])
        self._emit(wire.to_bytes(begin + end))
        self.events += n
        self.counts[category] = self.counts.get(category, 0) + n

    def _string_annotations(self, key: str, choices: Sequence[str]) -> list[bytes]:
        """Encoded string debug annotations, made equal in length where possible by padding
        the name's iid varint, so batch rows stay the same width. The strings are interned
        (`string_value_iid`): a compiled graph's instructions each name their section's ops,
        source line and module, which written out took most of a 645-byte packet."""
        cache_key = (key, tuple(choices))
        cached = self._string_tables.get(cache_key)
        if cached is not None:
            return cached
        iid = self._iid(F.I_ANNOTATION_NAMES, key)
        values = [wire.field_varint(F.A_STRING_IID,
                                    self._iid(F.I_DEBUG_ANNOTATION_STRING_VALUES, c))
                  for c in choices]
        longest = max(len(v) for v in values)
        base = len(wire.varint(iid))
        out = []
        for v in values:
            width = base + longest - len(v)
            name = (b"\x08" + wire.padded_varint(iid, width)) if width <= 10 else \
                wire.field_varint(1, iid)
            out.append(wire.field_bytes(F.E_DEBUG, name + v))
        if len(self._string_tables) < 1000:
            self._string_tables[cache_key] = out
        return out

    def counters(self, tracks: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None:
        """Write N counter values at once (float values as doubles, ints as int64)."""
        n = len(ts)
        if n == 0:
            return
        values = np.asarray(values)
        if values.dtype.kind == "f":
            value_seg = [wire.const(wire.tag(F.E_DOUBLE_COUNTER, wire.FIXED64), n),
                         wire.fixed64s(values.astype(np.float64))]
        else:
            value_seg = [wire.const(wire.tag(F.E_COUNTER, wire.VARINT), n),
                         wire.varints(values.astype(np.int64))]
        event = [
            wire.const(wire.field_varint(F.E_TYPE, _COUNTER) + wire.tag(F.E_TRACK, wire.VARINT), n),
            wire.varints(np.asarray(tracks, np.int64)),
            *value_seg,
        ]
        packet = wire.message(_TRACE_PACKET, [
            wire.const(wire.tag(F.P_TIMESTAMP, wire.VARINT), n),
            wire.varints(np.asarray(ts, np.int64)),
            *wire.message(F.P_TRACK_EVENT, event),
            wire.const(self._seq_needs, n),
        ])
        self._start_sequence()
        self._emit(wire.to_bytes(packet))
        self.events += n
        self.counts["counter"] = self.counts.get("counter", 0) + n
