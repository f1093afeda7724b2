"""Helpers the collector tests share: read a .pftrace with perfetto's protos into plain rows."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_explorer.loaders.chrome_json import parse_json
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


@dataclass
class Slice:
    track: int
    ts: int
    dur: int
    name: str
    category: str
    args: dict
    flow_out: list[int]
    flow_in: list[int]
    depth: int = 0
    parent: Slice | None = None


@dataclass
class ParsedTrace:
    packets: list
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    instants: list[Slice] = field(default_factory=list)
    counters: list[tuple[int, int, float]] = field(default_factory=list)

    def track_name(self, uuid: int) -> str:
        d = self.tracks[uuid]
        if d.HasField("thread"):
            return d.thread.thread_name
        if d.HasField("process"):
            return d.process.process_name
        return d.name

    def by_category(self, category: str) -> list[Slice]:
        return [s for s in self.slices if s.category == category]

    def track_names(self) -> set[str]:
        return {self.track_name(u) for u in self.tracks}


def _value(a: pb.DebugAnnotation, strings: dict[int, str]):
    kind = a.WhichOneof("value")
    if kind == "string_value_iid":  # interned, as Perfetto resolves it
        return strings[a.string_value_iid]
    return getattr(a, kind) if kind else None


def parse(path: str | Path) -> ParsedTrace:
    """Parse a trace the way Perfetto does: interned state per sequence, slices by begin/end."""
    trace = pb.Trace()
    trace.ParseFromString(Path(path).read_bytes())
    out = ParsedTrace(list(trace.packet))
    names: dict[int, str] = {}
    cats: dict[int, str] = {}
    anames: dict[int, str] = {}
    strings: dict[int, str] = {}
    stacks: dict[int, list[Slice]] = {}
    events = []
    for i, p in enumerate(trace.packet):
        assert p.trusted_packet_sequence_id, "every packet names its sequence"
        if i == 0:
            assert p.sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        else:
            assert p.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        if p.HasField("interned_data"):
            for e in p.interned_data.event_names:
                names[e.iid] = e.name
            for e in p.interned_data.event_categories:
                cats[e.iid] = e.name
            for e in p.interned_data.debug_annotation_names:
                anames[e.iid] = e.name
            for e in p.interned_data.debug_annotation_string_values:
                strings[e.iid] = e.str.decode()
        if p.HasField("track_descriptor"):
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            events.append((p.timestamp, i, p.track_event))
    events.sort(key=lambda e: (e[0], e[1]))  # stable: file order breaks ties, as in Perfetto
    for ts, _, te in events:
        assert te.track_uuid in out.tracks, "events use registered tracks"
        if te.type == pb.TrackEvent.TYPE_SLICE_END:
            stack = stacks.get(te.track_uuid)
            assert stack, f"slice end without begin at {ts}"
            s = stack.pop()
            s.dur = ts - s.ts
            continue
        if te.type == pb.TrackEvent.TYPE_COUNTER:
            value = (te.double_counter_value if te.HasField("double_counter_value")
                     else te.counter_value)
            out.counters.append((te.track_uuid, ts, value))
            continue
        args = {anames[a.name_iid]: _value(a, strings) for a in te.debug_annotations}
        s = Slice(te.track_uuid, ts, -1, names[te.name_iid], cats[te.category_iids[0]], args,
                  list(te.flow_ids), list(te.terminating_flow_ids))
        if te.type == pb.TrackEvent.TYPE_INSTANT:
            out.instants.append(s)
            continue
        stack = stacks.setdefault(te.track_uuid, [])
        s.depth = len(stack)
        s.parent = stack[-1] if stack else None
        stack.append(s)
        out.slices.append(s)
    return out


def read_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The events of a Chrome-trace JSON file, also of one cut short by a killed run (then
    the complete ones, as the loader reads them), without the `{}` closing the list."""
    doc, _ = parse_json(os.fspath(path), Path(path).read_bytes())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and e]


def partial_overlaps(json_path: str | Path) -> list[tuple[tuple, tuple]]:
    """Pairs of slices on one thread's track of a JSON trace that overlap without one
    holding the other: (outer, inner) as (start ns, end ns, name). A JSON trace keeps each
    slice's intended start and duration (an X event), so no pairing of begin and end
    events can hide a range that ends after its parent."""
    import json

    tracks: dict[tuple, list[tuple[int, int, str]]] = {}
    for e in json.loads(Path(json_path).read_text())["traceEvents"]:
        if e.get("ph") == "X":
            start = round(e["ts"] * 1000)
            tracks.setdefault((e["pid"], e["tid"]), []).append(
                (start, start + round(e["dur"] * 1000), e["name"]))
    bad = []
    for slices in tracks.values():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_: list[tuple[int, int, str]] = []
        for s in slices:
            while open_ and open_[-1][1] <= s[0]:
                open_.pop()
            if open_ and s[1] > open_[-1][1]:
                bad.append((open_[-1], s))
            open_.append(s)
    return bad
