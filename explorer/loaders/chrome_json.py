"""Chrome-trace JSON: our `--format json` traces and PyTorch-profiler (Kineto) traces
(whose categories and args `kineto.py` maps onto ours).

Times in Chrome JSON are microseconds (floats); they become int64 ns without
going through a float at nanosecond scale, which would lose precision at the
epoch-based timestamps Kineto writes.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal
from itertools import pairwise
from typing import Any, Self

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.errors import TraceFormatError, TruncatedTraceWarning
from neuron_explorer.loaders.args import ArgsBuilder, ColumnArgs
from neuron_explorer.loaders.kinds import our_kind
from neuron_explorer.loaders.kineto import (
    DEVICE_CATEGORIES,
    HOST_OPS,
    is_kineto,
    kineto_category,
    kineto_kind,
    our_args,
)
from neuron_explorer.loaders.metadata import merge_metadata, missing_end_mark
from neuron_explorer.loaders.nesting import bind_flow_points
from neuron_explorer.loaders.raw import COUNTER_COLUMNS, FLOW_COLUMNS, RawTrace, build_slices
from neuron_explorer.loaders.track_kinds import our_device, track_table


def us_to_ns(values: Any) -> np.ndarray:
    """Microsecond floats to int64 ns, exact to the nanosecond for epoch-scale times."""
    us = np.asarray(values, dtype=np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


# From 2**43 µs (about 100 days after a clock's zero, e.g. epoch-based times) a float64
# of microseconds no longer holds every nanosecond: such times are read from their digits.
EXACT_US = float(2**43)


class _Written(float):
    """A float that keeps the digits it was written with."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> Self:
        value = float.__new__(cls, text)
        value.text = text
        return value


def _written_ns(text: str) -> int:
    """Microseconds as written (`1682725898236567.047`) to int ns, exactly."""
    whole, _, fraction = text.partition(".")
    if len(fraction) <= 3 and whole.lstrip("-").isdigit() and fraction.isdigit():
        # the common form (Kineto writes three decimals), without a Decimal
        ns = abs(int(whole)) * 1000 + int(fraction.ljust(3, "0"))
        return -ns if whole.startswith("-") else ns
    return int((Decimal(text) * 1000).to_integral_value(ROUND_HALF_EVEN))


_loads: Callable[[bytes | bytearray], Any]
try:  # orjson parses large traces several times faster; the standard library also works
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads


def _loads_exact(text: bytes) -> Any:
    """JSON whose floats keep their digits (the standard library's parser: slower)."""
    return json.loads(text, parse_float=_Written)


def parse_json(path: str, text: bytes | bytearray, loads: Any = None) -> tuple[Any, str | None]:
    """The JSON document, or a TraceFormatError naming where it breaks.

    A trace cut short (a killed recording: our writer streams one event per line) gives
    the document of its complete events and a warning saying so; else the warning is None.
    """
    loads = loads or _loads
    try:
        return loads(text), None
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON ({exc.msg})"
        if "UTF-8" in exc.msg:
            reason = "not UTF-8 text: the file is corrupt"
        elif "end of data" in exc.msg or not text.rstrip().endswith((b"}", b"]")):
            recovered = _complete_prefix(text, exc.pos, loads)
            if recovered is not None:
                doc, kept = recovered
                return doc, (f"{path}: the JSON ends early at byte {len(text)} (was the "
                             f"recording killed?); loaded the complete events before byte "
                             f"{kept}")
            reason = f"the JSON ends early ({exc.msg}): the file is truncated"
        raise TraceFormatError(path, reason, exc.pos) from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, "not text: the file is corrupt", exc.start) from None


_CLOSERS = (b"]}", b"]")  # {"traceEvents": [ ... or a bare list [ ...
_PREFIX_TRIES = 16  # event ends tried, from the last one back


def _complete_prefix(text: bytes | bytearray, broken_at: int, loads: Any
                     ) -> tuple[Any, int] | None:
    """The trace made of the events that end before the cut: the list is closed after the
    last `}` that ends an event (one followed by a comma) and parsed again."""
    view = bytes(text[:broken_at])
    end = len(view)
    for _ in range(_PREFIX_TRIES):
        at = view.rfind(b"}", 0, end)
        if at < 0:
            return None
        end = at
        if not view[at + 1:].lstrip().startswith(b","):
            continue  # an object's end inside an event (its args), or the cut itself
        for closer in _CLOSERS:
            try:
                doc = loads(view[:at + 1] + closer)
            except json.JSONDecodeError:
                continue
            events = doc.get("traceEvents") if isinstance(doc, dict) else doc
            if isinstance(events, list) and events:
                return doc, at + 1
    return None


SLICE_PHASES = ("X", "i", "I", "n", "B")
INT64_MAX = (1 << 63) - 1
# |µs| past which a time in ns would not fit an int64 (with room for a duration)
MAX_US = 4.6e15


class _Malformed(Exception):
    """One event's field has a type the loader cannot use; the loader adds where."""


class Collector:
    """Columns of the events read so far. Events come in chunks (the whole list, or a
    large document's events a chunk at a time); each chunk's times are converted to ns
    arrays as it is sealed (`_seal`), so no Python number per slice outlives its chunk."""

    def __init__(self) -> None:
        self.track_of: dict[tuple[Any, Any], int] = {}
        # this chunk's slices: tracks, times as written (checked when it is sealed),
        # names and categories as codes into `texts`, args as written
        self.s_track: list[int] = []
        self.s_ts: list[Any] = []
        self.s_dur: list[Any] = []
        self.s_name: list[int] = []
        self.s_cat: list[int] = []
        self.s_args: list[Any] = []
        self.codes: dict[str, int] = {}  # a name or category -> its code
        self.texts: list[str] = []  # by code
        # the sealed chunks' slices, as arrays per chunk (track, ts ns, dur ns, name code,
        # category code) and args as columns
        self.sealed = 0
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.args = ArgsBuilder()
        self.exact = False  # some chunk was parsed keeping the digits of its floats
        # begins not yet ended when their chunk was sealed: an end's args join theirs
        self.open_args: dict[int, dict[str, Any] | None] = {}
        self.c_track: list[int] = []
        self.c_ts: list[Any] = []
        self.c_value: list[float] = []
        self.c_event: list[int] = []  # each counter value's event, for messages
        self.counter_tracks: dict[tuple[Any, str], int] = {}
        self.flow_points: list[tuple[str, Any, str, int, Any, bool, int]] = []
        self.open_begins: dict[int, list[int]] = defaultdict(list)
        self.ends: dict[int, tuple[Any, int]] = {}  # begin slice -> (end ts, end event)
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.skipped: Counter[str] = Counter()

    def track(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        try:
            t = self.track_of.get(key)
        except TypeError:  # an object or a list: say which
            _check_id("pid", pid)
            _check_id("tid", tid)
            raise
        if t is None:
            _check_id("pid", pid)
            _check_id("tid", tid)
            t = self.track_of[key] = len(self.track_of)
        return t

    def join_args(self, i: int, args: dict[str, Any]) -> None:
        """An end event's args, added to its begin's (slice `i`)."""
        if i in self.open_args:
            self.open_args[i] = {**(self.open_args[i] or {}), **args}
        else:  # the begin is in this chunk
            own = self.s_args[i - self.sealed]
            self.s_args[i - self.sealed] = {**(own or {}), **args}

    def slice(self, e: dict, track: int, dur: Any) -> None:
        args = e.get("args") or None
        if args is not None and args.__class__ is not dict:
            raise _Malformed(f"'args' must be an object, not {_shown(args)}")
        name, cat = self.code(str(e.get("name", ""))), self.code(str(e.get("cat", "")))
        self.s_track.append(track)  # nothing below can fail: the columns stay aligned
        self.s_ts.append(e.get("ts"))
        self.s_dur.append(dur)
        self.s_name.append(name)
        self.s_cat.append(cat)
        self.s_args.append(args)

    def code(self, text: str) -> int:
        found = self.codes.get(text)
        if found is None:
            found = self.codes[text] = len(self.texts)
            self.texts.append(text)
        return found


def _shown(value: Any) -> str:
    """A JSON value for a message, kept short."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_id(field: str, value: Any) -> None:
    """pid and tid: a number or a string (or absent), an integer within 64 bits."""
    if value.__class__ is int and -INT64_MAX - 1 <= value <= INT64_MAX:
        return  # the common case first: every metadata event names two of them
    if value is None or isinstance(value, str | float):
        return
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise _Malformed(f"'{field}' {value} is out of range (64-bit integers)")
        return
    raise _Malformed(f"'{field}' must be a number or a string, not {_shown(value)}")


def _object(e: dict, field: str) -> dict:
    value = e.get(field) or {}
    if value.__class__ is not dict:
        raise _Malformed(f"'{field}' must be an object, not {_shown(value)}")
    return value


def _read_events(path: str, events: list, col: Collector, first: int = 0) -> None:
    """Collect every event (`first`: the index of `events[0]` in the trace); a known event
    with a field of the wrong type raises a TraceFormatError naming the event (unknown
    phases and non-objects are counted)."""
    index = first
    try:
        for index, e in enumerate(events, first):  # one loop, no call per event: the hot path
            if e.__class__ is not dict:
                col.skipped["not an event object"] += 1
                continue
            if not e:
                continue  # streamed writers close the event list with an empty object
            ph = e.get("ph")
            if ph == "X":
                col.slice(e, col.track(e.get("pid"), e.get("tid")), e.get("dur", 0))
            elif ph in ("i", "I", "n"):
                col.slice(e, col.track(e.get("pid"), e.get("tid")), 0)
            elif ph == "B":
                t = col.track(e.get("pid"), e.get("tid"))
                col.slice(e, t, 0)
                col.open_begins[t].append(col.sealed + len(col.s_ts) - 1)
            elif ph == "E":
                t = col.track(e.get("pid"), e.get("tid"))
                args = _object(e, "args")
                if col.open_begins[t]:
                    i = col.open_begins[t].pop()
                    col.ends[i] = (e.get("ts"), index)
                    if args:
                        col.join_args(i, args)
                else:
                    col.skipped["end without begin"] += 1
            elif ph == "C":
                _counter(e, col, index)
            elif ph in ("s", "t", "f"):
                t = col.track(e.get("pid"), e.get("tid"))
                fid = e.get("id")
                if fid is not None and not isinstance(fid, int | str | float):
                    raise _Malformed("a flow's 'id' must be a number or a string, not "
                                     f"{_shown(fid)}")
                enclosing = ph != "f" or e.get("bp") == "e"
                col.flow_points.append((str(e.get("cat", "")), fid, ph, t, e.get("ts"),
                                        enclosing, index))
            elif ph == "M":
                if e.get("name") in NAMING_EVENTS:  # sort indexes, labels: nothing read
                    _metadata_event(e, col)
            else:
                col.skipped[f"event phase {ph!r}"] += 1
    except (_Malformed, KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise TraceFormatError(path, f"{events[index - first].get('ph')!r} event: {exc}",
                               event=index) from None


def _counter(e: dict, col: Collector, index: int) -> None:
    args = _object(e, "args")
    name = str(e.get("name", ""))
    pid = e.get("pid")
    _check_id("pid", pid)
    try:
        rows = [(series, float(value)) for series, value in args.items()]  # all, or none
    except (TypeError, ValueError):
        raise _Malformed(f"counter values must be numbers: {_shown(args)}") from None
    for series, value in rows:
        key = (pid, name if series in ("value", name) or len(args) == 1 else f"{name}.{series}")
        col.c_track.append(col.counter_tracks.setdefault(key, len(col.counter_tracks)))
        col.c_ts.append(e.get("ts"))
        col.c_value.append(value)
        col.c_event.append(index)


# the metadata events read (a device's trace can repeat the others, sort indexes and
# labels, hundreds of thousands of times)
NAMING_EVENTS = frozenset(("process_name", "thread_name"))


def _metadata_event(e: dict, col: Collector) -> None:
    name = e.get("name")
    value = _object(e, "args").get("name")
    pid, tid = e.get("pid"), e.get("tid")
    _check_id("pid", pid)
    _check_id("tid", tid)
    if name == "process_name" and value is not None:
        col.process_names[pid] = str(value)
    elif name == "thread_name" and value is not None:
        col.thread_names[(pid, tid)] = str(value)


def _tracks(col: Collector, device_pids: set[Any], kineto: bool) -> pd.DataFrame:
    rows = []
    for (pid, tid), t in col.track_of.items():
        pname = col.process_names.get(pid, str(pid))
        tname = col.thread_names.get((pid, tid), f"thread {tid}")
        device, kind = our_device(pname, tname)
        if device < 0 and kineto and pid in device_pids:
            device = pid if isinstance(pid, int) else 0
            kind = "dma" if "dma" in tname.lower() else "gpu_stream"
        rows.append((t, tname, kind, pname, _as_int(pid), _as_int(tid), device))
    for (pid, name), t in col.counter_tracks.items():
        pname = col.process_names.get(pid, str(pid))
        device, _ = our_device(pname, name)
        if device < 0 and pid in device_pids:
            device = pid
        rows.append((len(col.track_of) + t, name, "counter", pname, _as_int(pid), -1, device))
    return track_table(rows)


def _as_int(value: Any) -> int:
    """An id as an int64 (-1 when it is not a number that fits)."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return -1
    return number if -INT64_MAX - 1 <= number <= INT64_MAX else -1


def _times(path: str, values: list, what: str, event_of: Any, exact: bool = False
           ) -> np.ndarray:
    """Times or durations in µs as written (numbers, or numeric strings, which Perfetto also
    reads) as int64 ns; the first value that is none raises a TraceFormatError naming its
    event (`event_of` maps a value's index to its event's)."""
    try:
        us = np.asarray(values, dtype=np.float64)
        ok = us.ndim == 1 and bool((np.abs(us) < MAX_US).all())  # NaN (absent) fails too
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        k = next((k for k, v in enumerate(values) if not _is_time(v)), None)
        shown = "missing" if k is None or values[k] is None else f"{_shown(values[k])}"
        raise TraceFormatError(path, f"'{what}' is {shown}: expected a number of "
                               "microseconds", event=None if k is None else event_of(k))
    ns = us_to_ns(us)
    if exact:  # parsed keeping the digits of floats: those at large times, from the digits
        for k, v in enumerate(values):
            if v.__class__ is _Written and abs(v) >= EXACT_US:
                ns[k] = _written_ns(v.text)
    return ns


def _is_time(value: Any) -> bool:
    try:
        return abs(float(value)) < MAX_US
    except (TypeError, ValueError, OverflowError):
        return False


def _slice_event(events: list, first: int = 0) -> Any:
    """Index of a slice of `events` -> index of its event in the trace (each event of a
    slice phase made one; `first`: the index of `events[0]`)."""
    def event_of(k: int) -> int:
        seen = -1
        for i, e in enumerate(events):
            if e.__class__ is dict and e.get("ph") in SLICE_PHASES:
                seen += 1
                if seen == k:
                    return first + i
        return -1
    return event_of


# A time field written as a float of 8e12 or more (13 digits before the point starting
# with 8 or 9, or more digits): from 2**43 us, a float no longer holds the nanoseconds.
LARGE_US = 8e12
_LARGE_FLOAT = {key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*(-?(?:[89]\d{12}|[1-9]\d{13,})'
                                rb'(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+))')
                for key in ("ts", "dur")}


def _written_times(text: bytes | bytearray, events: list) -> bool | None:
    """Give each event time too large for a float to hold its nanoseconds (epoch-scale
    times with ns fractions) its written digits, in place: a `_Written` for the float.

    The digits are the text's `"ts": <float>` fields of 8e12 or more (and `"dur"`'s,
    where a `ts` needs them), in order, one per event with such a float time, each
    checked to read as the float the parser made. None when no time needs them; False
    when the fields do not line up with the events (a nested object with a "ts" key, a
    time written with an exponent): the caller parses again keeping every float's
    digits, the slow way that cannot be misled."""
    if not _LARGE_FLOAT["ts"].search(text):
        return None  # the common case: a scan of the text, no event looked at
    needed = None
    for key, large_float in _LARGE_FLOAT.items():
        if key != "ts" and not large_float.search(text):
            continue
        holders = [e for e in events if e.__class__ is dict
                   and (v := e.get(key)).__class__ is float and abs(v) >= LARGE_US]
        written = large_float.findall(text)
        if len(written) != len(holders) or not np.array_equal(
                np.array(written, dtype=bytes).astype(np.float64),
                np.fromiter((e[key] for e in holders), np.float64, len(holders))):
            return False
        make = float.__new__
        for e, digits in zip(holders, written, strict=True):
            e[key] = value = make(_Written, e[key])
            value.text = digits.decode()
        needed = True
    return needed


def _seal(path: str, events: list, col: Collector, first: int) -> None:
    """Convert the times of the slices `events` added (the chunk starting at event
    `first`) to ns arrays, checked: the first that is no time raises, naming its event."""
    event_of = _slice_event(events, first)
    ts = _times(path, col.s_ts, "ts", event_of, col.exact)
    dur = _times(path, col.s_dur, "dur", event_of, col.exact)
    col.parts.append((np.asarray(col.s_track, np.int64), ts, dur,
                      np.asarray(col.s_name, np.int64), np.asarray(col.s_cat, np.int64)))
    # begins still open keep their args as dicts until they end
    for begun in col.open_begins.values():
        for i in begun:
            if i >= col.sealed:
                col.open_args[i] = col.s_args[i - col.sealed]
                col.s_args[i - col.sealed] = None
    col.args.add(col.sealed, col.s_args)
    col.sealed += len(col.s_ts)
    col.s_track, col.s_ts, col.s_dur, col.s_name, col.s_cat, col.s_args = [], [], [], [], [], []


def collect_chunk(path: str, text: bytes | bytearray, events: list, col: Collector,
                  first: int, exact_events: Callable[[], list]) -> None:
    """Read one chunk of events (parsed from `text`) into `col` and seal it
    (`exact_events`: the same events parsed keeping the digits of floats, asked for when
    their times need digits that `_written_times` cannot find)."""
    digits = _written_times(text, events)
    if digits is False:
        events = exact_events()
    col.exact = col.exact or digits is not None
    _read_events(path, events, col, first)
    _seal(path, events, col, first)


def _flows(path: str, col: Collector, slices: pd.DataFrame, exact: bool = False
           ) -> tuple[pd.DataFrame, int]:
    if not col.flow_points:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in FLOW_COLUMNS}), 0
    cats, ids, phs, tracks, tss, encl, where = zip(*col.flow_points, strict=True)
    ts = _times(path, list(tss), "ts", lambda k: where[k], exact)
    bound = bind_flow_points(slices, np.asarray(tracks, np.int64), ts, np.asarray(encl, bool))
    # Kineto writes a flow's end before its start at times: pair by id, not file order.
    groups: dict[tuple[str, Any], list[tuple[int, int, int]]] = defaultdict(list)
    unbound = 0
    rank = {"s": 0, "t": 1, "f": 2}
    for cat, fid, ph, t_ns, sid in zip(cats, ids, phs, ts.tolist(), bound.tolist(), strict=True):
        if sid < 0:
            unbound += 1
            continue
        groups[(cat, fid)].append((rank[ph], t_ns, sid))
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


def _metadata(path: str, doc: Any, args: ColumnArgs, slices: pd.DataFrame, kineto: bool
              ) -> dict[str, Any]:
    base = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    # compared in Arrow: no Python string per slice
    ids = np.flatnonzero((slices["category"] == tf.CAT_METADATA).to_numpy(bool))
    texts = [v for v in args.column(tf.ARG_METADATA_JSON, ids).tolist() if v is not None]
    meta = merge_metadata(path, texts, base)
    if kineto:
        meta.update(HOST_OPS)
        props = meta.get("deviceProperties") or []
        if tf.META_HARDWARE not in meta and props and props[0].get("name"):
            meta[tf.META_HARDWARE] = str(props[0]["name"])
    return meta


def load_chrome_json(path: str, text: bytes | bytearray) -> RawTrace:
    """Read a Chrome-trace JSON document (ours or Kineto's) into columns."""
    doc, cut_short = parse_json(path, text)

    def exact_events() -> list:
        again, _ = parse_json(path, bytes(text), _loads_exact)
        return events_of(path, again)

    col = Collector()
    collect_chunk(path, text, events_of(path, doc), col, 0, exact_events)
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k != "traceEvents"}
    return assemble(path, col, doc, cut_short)


def events_of(path: str, doc: Any) -> list:
    """The event list of a parsed document (`{"traceEvents": [...]}` or a bare list)."""
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    if isinstance(doc, list):
        return doc
    raise TraceFormatError(
        path, "JSON without a 'traceEvents' list: not a Chrome or PyTorch-profiler trace")


def assemble(path: str, col: Collector, doc: Any, cut_short: str | None) -> RawTrace:
    """The trace from the collected events (`doc`: the document without its events, or
    the list for a bare list of events)."""
    if not col.sealed and not col.c_ts:
        raise TraceFormatError(path, "the trace holds no slices or counters")
    exact = col.exact
    track, ts, dur, names, categories = (
        np.concatenate([part[c] for part in col.parts]) if col.parts else np.zeros(0, np.int64)
        for c in range(5))
    col.parts = []
    dur = np.maximum(dur, 0)
    texts = col.texts
    category_codes = np.unique(categories)
    cats = {texts[c] for c in category_codes.tolist()}
    kineto = is_kineto(doc, cats)
    if col.ends:  # B/E pairs: the duration runs to the end's time
        begun = list(col.ends)
        end_ts, where = zip(*col.ends.values(), strict=True)
        ends = _times(path, list(end_ts), "ts", lambda k: where[k], exact)
        dur[begun] = np.maximum(ends - ts[begun], 0)
    n_open = sum(len(v) for v in col.open_begins.values())
    if n_open:  # begins never ended: close them at the end of the trace
        last = int((ts + dur).max())
        for idxs in col.open_begins.values():
            for i in idxs:
                dur[i] = last - ts[i]
        col.skipped["slice never ended (closed at trace end)"] += n_open
    device_pids: set[Any] = set()
    if kineto:
        device_cats = [c for c in category_codes.tolist()
                       if kineto_category(texts[c]) in DEVICE_CATEGORIES]
        on_dev_tracks = set(np.unique(track[np.isin(categories, device_cats)]).tolist())
        device_pids = {pid for (pid, tid), t in col.track_of.items() if t in on_dev_tracks}
        device_pids |= {p for p, n in col.process_names.items()
                        if isinstance(p, int) and _looks_like_device(n)}
    tracks = _tracks(col, device_pids, kineto)
    kinds = _kinds(col, tracks, track, names, categories, kineto)
    slices, order = build_slices(track, ts, dur, (names, texts), (categories, texts), kinds)
    kind_codes, kind_values = kinds[0][order], kinds[1]  # by slice id, for our args
    del track, ts, dur, names, categories, kinds  # in the slices now
    for i, held in sorted(col.open_args.items()):
        col.args.add(i, [held])
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    del order
    # with Kineto's, ours beside them: the tables read every trace alike
    args = col.args.build(len(new_id), new_id,
                          our_args(kind_codes, kind_values) if kineto else None)
    del new_id, kind_codes
    flows, unbound = _flows(path, col, slices, exact)
    if unbound:
        col.skipped["flow end outside any slice"] += unbound
    counter_names = {t: name for (_, name), t in col.counter_tracks.items()}
    c_track = np.asarray(col.c_track, np.int64)
    counters = pd.DataFrame(
        {
            "ts": _times(path, col.c_ts, "ts", col.c_event.__getitem__, exact),
            "value": np.asarray(col.c_value, np.float64),
            "track_id": c_track + len(col.track_of),
            "name": [counter_names[t] for t in col.c_track],
        },
        columns=COUNTER_COLUMNS,
    ).sort_values(["track_id", "ts"], kind="stable", ignore_index=True)
    warned = []
    metadata = _metadata(path, doc, args, slices, kineto)
    cut_short = cut_short or missing_end_mark(path, metadata)
    if cut_short:
        warnings.warn(cut_short, TruncatedTraceWarning, stacklevel=4)
        warned.append(cut_short)
    return RawTrace(
        path=path,
        source_format="kineto_json" if kineto else "chrome_json",
        slices=slices,
        args=args,
        tracks=tracks,
        counters=counters,
        flows=flows,
        metadata=metadata,
        skipped=dict(col.skipped),
        warnings=warned,
    )


def _kinds(col: Collector, tracks: pd.DataFrame, track: np.ndarray, names: np.ndarray,
           categories: np.ndarray, kineto: bool) -> tuple[np.ndarray, list[str]]:
    """Each slice's kind as codes into the distinct kinds: found once per distinct
    (category, name, on a device) of a Kineto trace, per category of ours."""
    texts = col.texts
    if kineto:
        on_device = np.zeros(len(col.track_of), np.int64)  # per thread track (ids 0..n-1)
        ids = tracks["track_id"].to_numpy()
        thread = ids < len(on_device)
        on_device[ids[thread]] = tracks["device"].to_numpy()[thread] >= 0
        key = (categories * len(texts) + names) * 2 + on_device[track]
        distinct, inverse = np.unique(key, return_inverse=True)
        kinds = [kineto_kind(texts[k // 2 // len(texts)], texts[k // 2 % len(texts)], bool(k % 2))
                 for k in distinct.tolist()]
    else:
        distinct, inverse = np.unique(categories, return_inverse=True)
        kinds = [our_kind(texts[c]) for c in distinct.tolist()]
    values = sorted(set(kinds))
    code = {kind: i for i, kind in enumerate(values)}
    return np.asarray([code[k] for k in kinds], np.int64)[inverse.reshape(-1)], values


def _looks_like_device(process_name: str) -> bool:
    low = process_name.lower()
    return any(low.startswith(p) for p in ("gpu ", "mtia ", "device "))
