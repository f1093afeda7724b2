"""Hand-built traces for the explorer's tests, written as .pftrace (via Perfetto's own
protobuf classes) or as Chrome-trace JSON, with exactly the events a test puts in."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_explorer.common import trace_format as tf


@dataclass
class Track:
    uuid: int
    name: str
    pid: int
    tid: int | None = None  # thread track when set
    counter: bool = False


@dataclass
class Event:
    track: Track
    ts: int
    dur: int | None  # None: counter
    name: str = ""
    category: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    flow_out: list[int] = field(default_factory=list)
    flow_in: list[int] = field(default_factory=list)
    value: float = 0.0


class TraceBuilder:
    """Collects tracks and events; writes them in either format."""

    def __init__(self) -> None:
        self.processes: dict[int, str] = {}
        self.tracks: list[Track] = []
        self.events: list[Event] = []
        self._uuid = 1000

    def _new(self, **kw: Any) -> Track:
        self._uuid += 1
        t = Track(uuid=self._uuid, **kw)
        self.tracks.append(t)
        return t

    def thread(self, pid: int = 100, tid: int = 100, name: str = "MainThread",
               process: str = "python train.py") -> Track:
        self.processes.setdefault(pid, process)
        return self._new(name=name, pid=pid, tid=tid)

    def device_track(self, device: int, name: str, preset: str = "trn2") -> Track:
        pid = 10_000 + device
        self.processes.setdefault(pid, tf.DEVICE_PROCESS.format(index=device, preset=preset))
        return self._new(name=name, pid=pid)

    def counter_track(self, device: int, name: str, preset: str = "trn2") -> Track:
        pid = 10_000 + device
        self.processes.setdefault(pid, tf.DEVICE_PROCESS.format(index=device, preset=preset))
        return self._new(name=name, pid=pid, counter=True)

    def slice(self, track: Track, ts: int, dur: int, name: str, category: str,
              args: dict[str, Any] | None = None, flow_out: list[int] | None = None,
              flow_in: list[int] | None = None) -> None:
        self.events.append(Event(track, ts, dur, name, category, dict(args or {}),
                                 list(flow_out or []), list(flow_in or [])))

    def instant(self, track: Track, ts: int, name: str, category: str,
                args: dict[str, Any] | None = None) -> None:
        self.slice(track, ts, 0, name, category, args)

    def counter(self, track: Track, ts: int, value: float) -> None:
        self.events.append(Event(track, ts, None, track.name, value=value))

    def metadata(self, track: Track, meta: dict[str, Any], ts: int = 0) -> None:
        self.instant(track, ts, "metadata", tf.CAT_METADATA,
                     {tf.ARG_METADATA_JSON: json.dumps(meta)})

    # --- writers -------------------------------------------------------------------------
    def _ordered(self) -> list[tuple[Event, str]]:
        """Begin/end/instant/counter records in time order, nesting kept per track."""
        recs = []
        for i, e in enumerate(self.events):
            if e.dur is None:
                recs.append(((e.ts, 1, 0, i), e, "counter"))
            elif e.dur == 0:
                recs.append(((e.ts, 2, 0, i), e, "instant"))
            else:
                recs.append(((e.ts, 1, -e.dur, i), e, "begin"))
                recs.append(((e.ts + e.dur, 0, -e.ts, -i), e, "end"))
        recs.sort(key=lambda r: r[0])
        return [(e, kind) for _, e, kind in recs]

    def write_pftrace(self, path: Path, *, intern: bool = True, truncate: int = 0) -> Path:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        trace = pb.Trace()
        proc_uuid = {}
        for pid, name in self.processes.items():
            p = trace.packet.add()
            self._uuid += 1
            proc_uuid[pid] = self._uuid
            p.track_descriptor.uuid = self._uuid
            p.track_descriptor.process.pid = pid
            p.track_descriptor.process.process_name = name
        for t in self.tracks:
            p = trace.packet.add()
            d = p.track_descriptor
            d.uuid = t.uuid
            if t.tid is not None:
                d.thread.pid = t.pid
                d.thread.tid = t.tid
                d.thread.thread_name = t.name
            else:
                d.name = t.name
                d.parent_uuid = proc_uuid[t.pid]
                if t.counter:
                    d.counter.SetInParent()
        tables: dict[str, dict[str, int]] = {"name": {}, "cat": {}, "ann": {}}
        first = True
        for e, kind in self._ordered():
            p = trace.packet.add()
            p.timestamp = e.ts + (e.dur if kind == "end" else 0)
            p.trusted_packet_sequence_id = 7
            if first:
                p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
                first = False
            te = p.track_event
            te.track_uuid = e.track.uuid
            if kind == "counter":
                te.type = pb.TrackEvent.TYPE_COUNTER
                if float(e.value).is_integer():
                    te.counter_value = int(e.value)
                else:
                    te.double_counter_value = e.value
                continue
            if kind == "end":
                te.type = pb.TrackEvent.TYPE_SLICE_END
                continue
            te.type = (pb.TrackEvent.TYPE_INSTANT if kind == "instant"
                       else pb.TrackEvent.TYPE_SLICE_BEGIN)
            if intern:
                te.name_iid = self._intern(p, tables, "name", e.name)
                te.category_iids.append(self._intern(p, tables, "cat", e.category))
            else:
                te.name = e.name
                te.categories.append(e.category)
            for k, v in e.args.items():
                a = te.debug_annotations.add()
                if intern:
                    a.name_iid = self._intern(p, tables, "ann", k)
                else:
                    a.name = k
                if isinstance(v, bool):
                    a.bool_value = v
                elif isinstance(v, int):
                    a.int_value = v
                elif isinstance(v, float):
                    a.double_value = v
                else:
                    a.string_value = str(v)
            te.flow_ids.extend(e.flow_out)
            te.terminating_flow_ids.extend(e.flow_in)
        data = trace.SerializeToString()
        if truncate:
            data = data[:-truncate]
        path.write_bytes(data)
        return path

    @staticmethod
    def _intern(packet: Any, tables: dict[str, dict[str, int]], kind: str, value: str) -> int:
        table = tables[kind]
        if value not in table:
            table[value] = len(table) + 1
            data = packet.interned_data
            entry = {"name": data.event_names, "cat": data.event_categories,
                     "ann": data.debug_annotation_names}[kind].add()
            entry.iid = table[value]
            entry.name = value
        return table[value]

    def chrome_events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for pid, name in self.processes.items():
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": name}})
        for t in self.tracks:
            tid = t.tid if t.tid is not None else t.uuid
            out.append({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": tid,
                        "args": {"name": t.name}})
        for e in self.events:
            tid = e.track.tid if e.track.tid is not None else e.track.uuid
            base = {"pid": e.track.pid, "tid": tid, "ts": e.ts / 1000}
            if e.dur is None:
                out.append({**base, "ph": "C", "name": e.name, "args": {"value": e.value}})
                continue
            ph = "i" if e.dur == 0 else "X"
            ev = {**base, "ph": ph, "name": e.name, "cat": e.category, "args": e.args}
            if ph == "X":
                ev["dur"] = e.dur / 1000
            out.append(ev)
            for fid in e.flow_out:
                out.append({**base, "ph": "s", "id": fid, "cat": "flow", "name": "flow"})
            for fid in e.flow_in:
                out.append({**base, "ph": "f", "bp": "e", "id": fid, "cat": "flow",
                            "name": "flow"})
        return out

    def write_json(self, path: Path, *, gz: bool = False) -> Path:
        text = json.dumps({"traceEvents": self.chrome_events()}).encode()
        path.write_bytes(gzip.compress(text) if gz else text)
        return path
