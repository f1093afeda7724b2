"""Chrome-trace JSON: our `--format json` traces and PyTorch-profiler (Kineto) traces.

Times in Chrome JSON are microseconds (floats); they become int64 ns without
going through a float at nanosecond scale, which would lose precision at the
epoch-based timestamps Kineto writes.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer import trace_format as tf
from neuron_explorer.errors import TraceFormatError
from neuron_explorer.loaders.args import DictArgs
from neuron_explorer.loaders.kinds import (
    DEVICE_PROCESS_NAME,
    KINETO_MARKERS,
    is_device_category,
    kineto_category,
    kineto_kind,
    our_kind,
)
from neuron_explorer.loaders.raw import (
    COUNTER_COLUMNS,
    FLOW_COLUMNS,
    TRACK_COLUMNS,
    RawTrace,
    build_slices,
)
from neuron_explorer.loaders.track_kinds import device_track_kind


def us_to_ns(values: list[float]) -> np.ndarray:
    """Microsecond floats to int64 ns, exact to the nanosecond for epoch-scale times."""
    us = np.asarray(values, dtype=np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


try:  # orjson parses large traces several times faster; the standard library also works
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads


def parse_json(path: str, text: bytes) -> Any:
    """The JSON document, or a TraceFormatError naming where it breaks."""
    try:
        return _loads(text)
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON ({exc.msg})"
        if "UTF-8" in exc.msg:
            reason = "not UTF-8 text: the file is corrupt"
        elif not text.rstrip().endswith((b"}", b"]")):
            reason = f"the JSON ends early ({exc.msg}): the file is truncated"
        raise TraceFormatError(path, reason, exc.pos) from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, "not text: the file is corrupt", exc.start) from None


class _Collector:
    """Columns of the events read so far."""

    def __init__(self) -> None:
        self.track_of: dict[tuple[Any, Any], int] = {}
        self.s_track: list[int] = []
        self.s_ts: list[float] = []
        self.s_dur: list[float] = []
        self.s_name: list[str] = []
        self.s_cat: list[str] = []
        self.s_args: list[Any] = []
        self.c_track: list[int] = []
        self.c_ts: list[float] = []
        self.c_value: list[float] = []
        self.counter_tracks: dict[tuple[Any, str], int] = {}
        self.flow_points: list[tuple[str, Any, str, int, float, bool]] = []
        self.open_begins: dict[int, list[int]] = defaultdict(list)
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.skipped: Counter[str] = Counter()

    def track(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        t = self.track_of.get(key)
        if t is None:
            t = self.track_of[key] = len(self.track_of)
        return t

    def slice(self, e: dict, track: int, dur: float) -> None:
        self.s_track.append(track)
        self.s_ts.append(e["ts"])
        self.s_dur.append(dur)
        self.s_name.append(str(e.get("name", "")))
        self.s_cat.append(str(e.get("cat", "")))
        self.s_args.append(e.get("args") or None)


def _read_events(events: list, col: _Collector) -> None:
    for e in events:
        if not e and isinstance(e, dict):
            continue  # streamed writers close the event list with an empty object
        if not isinstance(e, dict):
            col.skipped["not an event object"] += 1
            continue
        ph = e.get("ph")
        try:
            if ph == "X":
                col.slice(e, col.track(e.get("pid"), e.get("tid")), e.get("dur", 0))
            elif ph in ("i", "I", "n"):
                col.slice(e, col.track(e.get("pid"), e.get("tid")), 0)
            elif ph == "B":
                t = col.track(e.get("pid"), e.get("tid"))
                col.open_begins[t].append(len(col.s_ts))
                col.slice(e, t, -1)
            elif ph == "E":
                t = col.track(e.get("pid"), e.get("tid"))
                if col.open_begins[t]:
                    i = col.open_begins[t].pop()
                    col.s_dur[i] = e["ts"] - col.s_ts[i]
                    if e.get("args"):
                        col.s_args[i] = {**(col.s_args[i] or {}), **e["args"]}
                else:
                    col.skipped["end without begin"] += 1
            elif ph == "C":
                for series, value in (e.get("args") or {}).items():
                    name = str(e.get("name", ""))
                    if series not in ("value", name) and len(e["args"]) > 1:
                        name = f"{name}.{series}"
                    key = (e.get("pid"), name)
                    t = col.counter_tracks.setdefault(key, len(col.counter_tracks))
                    col.c_track.append(t)
                    col.c_ts.append(e["ts"])
                    col.c_value.append(float(value))
            elif ph in ("s", "t", "f"):
                t = col.track(e.get("pid"), e.get("tid"))
                enclosing = ph != "f" or e.get("bp") == "e"
                col.flow_points.append(
                    (str(e.get("cat", "")), e.get("id"), ph, t, e["ts"], enclosing)
                )
            elif ph == "M":
                name = e.get("name")
                value = (e.get("args") or {}).get("name")
                if name == "process_name" and value is not None:
                    col.process_names[e.get("pid")] = str(value)
                elif name == "thread_name" and value is not None:
                    col.thread_names[(e.get("pid"), e.get("tid"))] = str(value)
            else:
                col.skipped[f"event phase {ph!r}"] += 1
        except (KeyError, TypeError, ValueError):
            col.skipped[f"malformed {ph!r} event"] += 1


def _is_kineto(doc: Any, cats: set[str]) -> bool:
    if isinstance(doc, dict) and ("schemaVersion" in doc or "deviceProperties" in doc):
        return True
    known = {kineto_category(c) for c in cats if isinstance(c, str)}
    return bool(known & KINETO_MARKERS) and tf.CAT_METADATA not in cats


def _tracks(col: _Collector, device_pids: set[Any], kineto: bool) -> pd.DataFrame:
    rows = []
    for (pid, tid), t in col.track_of.items():
        pname = col.process_names.get(pid, str(pid))
        tname = col.thread_names.get((pid, tid), f"thread {tid}")
        ours = DEVICE_PROCESS_NAME.match(pname)
        if ours:
            device, kind = int(ours.group(1)), device_track_kind(tname)
        elif kineto and pid in device_pids:
            device = pid if isinstance(pid, int) else 0
            kind = "dma" if "dma" in tname.lower() else "gpu_stream"
        else:
            device, kind = -1, "thread"
        rows.append((t, tname, kind, pname, _as_int(pid), _as_int(tid), device))
    for (pid, name), t in col.counter_tracks.items():
        pname = col.process_names.get(pid, str(pid))
        ours = DEVICE_PROCESS_NAME.match(pname)
        device = int(ours.group(1)) if ours else (pid if pid in device_pids else -1)
        rows.append((len(col.track_of) + t, name, "counter", pname, _as_int(pid), -1, device))
    frame = pd.DataFrame(rows, columns=TRACK_COLUMNS)
    return frame.astype({"track_id": "int64", "pid": "int64", "tid": "int64", "device": "int64"})


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def bind_flow_points(
    slices: pd.DataFrame, track: np.ndarray, ts: np.ndarray, enclosing: np.ndarray,
    parent_of: np.ndarray | None = None, begin_ts: np.ndarray | None = None,
    begin_end: np.ndarray | None = None,
) -> np.ndarray:
    """Slice id each point binds to: the deepest slice enclosing it, or the next one.

    `slices` may be a subset of the slices; `parent_of`, `begin_ts`, `begin_end` (indexed
    by id) then describe all of them (default: taken from `slices`, ids = rows).
    """
    if not len(slices) or not len(track):
        return np.full(len(track), -1, np.int64)
    order = np.lexsort((slices["depth"].to_numpy(), slices["ts"].to_numpy(),
                        slices["track_id"].to_numpy()))
    s_track = slices["track_id"].to_numpy()[order]
    s_ts = slices["ts"].to_numpy()[order]
    s_end = s_ts + np.maximum(slices["dur"].to_numpy()[order], 0)
    s_id = slices["id"].to_numpy()[order]
    if parent_of is None:
        parent_of = slices["parent_id"].to_numpy()
        begin_ts = slices["ts"].to_numpy()
        begin_end = begin_ts + np.maximum(slices["dur"].to_numpy(), 0)
    assert begin_ts is not None and begin_end is not None
    # Search within each track: offset times by track so blocks never interleave.
    span = int(max(s_end.max(), ts.max()) - min(s_ts.min(), ts.min()) + 2)
    base = min(int(s_ts.min()), int(ts.min()))
    skey = s_track * span + (s_ts - base)
    qkey = track * span + (ts - base)
    right = np.searchsorted(skey, qkey, side="right") - 1
    left = np.searchsorted(skey, qkey, side="left")
    out = np.full(len(track), -1, np.int64)
    # enclosing: the latest slice starting at or before ts, or an ancestor holding ts
    cand = np.where(right >= 0, right, 0)
    ok = (right >= 0) & (s_track[cand] == track)
    found = np.where(ok, s_id[cand], -1)
    for _ in range(64):
        live = found >= 0
        f = np.where(live, found, 0)
        inside = live & (begin_ts[f] <= ts) & ((ts < begin_end[f]) | (begin_ts[f] == ts))
        climb = live & ~inside
        if not climb.any():
            break
        found = np.where(climb, parent_of[f], found)
    out[enclosing] = found[enclosing]
    # next slice: first starting at or after ts on the same track
    nxt = np.minimum(left, len(skey) - 1)
    ok_next = (left < len(skey)) & (s_track[nxt] == track)
    out[~enclosing] = np.where(ok_next, s_id[nxt], -1)[~enclosing]
    return out


def _flows(col: _Collector, slices: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    if not col.flow_points:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in FLOW_COLUMNS}), 0
    cats, ids, phs, tracks, tss, encl = zip(*col.flow_points, strict=True)
    bound = bind_flow_points(slices, np.asarray(tracks, np.int64), us_to_ns(list(tss)),
                             np.asarray(encl, bool))
    # Kineto writes a flow's end before its start at times: pair by id, not file order.
    groups: dict[tuple[str, Any], list[tuple[int, float, int]]] = defaultdict(list)
    unbound = 0
    rank = {"s": 0, "t": 1, "f": 2}
    for cat, fid, ph, t_us, sid in zip(cats, ids, phs, tss, bound, strict=True):
        if sid < 0:
            unbound += 1
            continue
        groups[(cat, fid)].append((rank[ph], t_us, int(sid)))
    rows = []
    for (_, fid), points in groups.items():
        points.sort()
        if points[0][0] != 0:
            continue  # no start: nothing to link
        for (_, _, a), (_, _, b) in pairwise(points):
            if a != b:
                rows.append((_as_int(fid), a, b))
    frame = pd.DataFrame(rows, columns=FLOW_COLUMNS).astype("int64")
    return frame, unbound


def _metadata(doc: Any, args: list, cats: list[str], kineto: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if isinstance(doc, dict):
        meta.update({k: v for k, v in doc.items() if k != "traceEvents"})
    for cat, a in zip(cats, args, strict=True):
        if cat == tf.CAT_METADATA and a and tf.ARG_METADATA_JSON in a:
            try:
                meta.update(json.loads(a[tf.ARG_METADATA_JSON]))
            except (TypeError, ValueError):
                pass
    if kineto and tf.META_HARDWARE not in meta:
        props = meta.get("deviceProperties") or []
        if props and isinstance(props[0], dict) and props[0].get("name"):
            meta[tf.META_HARDWARE] = props[0]["name"]
    return meta


def load_chrome_json(path: str, text: bytes) -> RawTrace:
    """Read a Chrome-trace JSON document (ours or Kineto's) into columns."""
    doc = parse_json(path, text)
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events = doc["traceEvents"]
    elif isinstance(doc, list):
        events = doc
    else:
        raise TraceFormatError(
            path, "JSON without a 'traceEvents' list: not a Chrome or PyTorch-profiler trace"
        )
    col = _Collector()
    _read_events(events, col)
    if not col.s_ts and not col.c_ts:
        raise TraceFormatError(path, "the trace holds no slices or counters")
    cats = set(col.s_cat)
    kineto = _is_kineto(doc, cats)
    n_open = sum(len(v) for v in col.open_begins.values())
    track = np.asarray(col.s_track, np.int64)
    ts = us_to_ns(col.s_ts)
    dur = us_to_ns([max(d, 0) for d in col.s_dur]) if col.s_dur else np.zeros(0, np.int64)
    if n_open:  # begins never ended: close them at the end of the trace
        last = int((ts + dur).max())
        for idxs in col.open_begins.values():
            for i in idxs:
                dur[i] = last - ts[i]
        col.skipped["slice never ended (closed at trace end)"] += n_open
    device_pids: set[Any] = set()
    if kineto:
        device_cats = {c for c in set(col.s_cat) if is_device_category(str(c))}
        on_dev_tracks = {col.s_track[i] for i, c in enumerate(col.s_cat) if c in device_cats}
        device_pids = {pid for (pid, tid), t in col.track_of.items() if t in on_dev_tracks}
        device_pids |= {p for p, n in col.process_names.items()
                        if isinstance(p, int) and _looks_like_device(n)}
    tracks = _tracks(col, device_pids, kineto)
    is_dev = dict(zip(tracks["track_id"], tracks["device"] >= 0, strict=True))
    if kineto:
        kinds = [kineto_kind(c, n, is_dev[t])
                 for c, n, t in zip(col.s_cat, col.s_name, col.s_track, strict=True)]
    else:
        kinds = [our_kind(c) for c in col.s_cat]
    slices, order = build_slices(track, ts, dur, np.asarray(col.s_name, object),
                                 np.asarray(col.s_cat, object), np.asarray(kinds, object))
    args = [col.s_args[i] for i in order]
    flows, unbound = _flows(col, slices)
    if unbound:
        col.skipped["flow end outside any slice"] += unbound
    counter_names = {t: name for (_, name), t in col.counter_tracks.items()}
    c_track = np.asarray(col.c_track, np.int64)
    counters = pd.DataFrame(
        {
            "ts": us_to_ns(col.c_ts),
            "value": np.asarray(col.c_value, np.float64),
            "track_id": c_track + len(col.track_of),
            "name": [counter_names[t] for t in col.c_track],
        },
        columns=COUNTER_COLUMNS,
    ).sort_values(["track_id", "ts"], kind="stable", ignore_index=True)
    return RawTrace(
        path=path,
        source_format="kineto_json" if kineto else "chrome_json",
        slices=slices,
        args=DictArgs(args),
        tracks=tracks,
        counters=counters,
        flows=flows,
        metadata=_metadata(doc, args, list(slices["category"]), kineto),
        skipped=dict(col.skipped),
    )


def _looks_like_device(process_name: str) -> bool:
    low = process_name.lower()
    return any(low.startswith(p) for p in ("gpu ", "mtia ", "device "))
