"""Streams the same events as Chrome-trace JSON (`--format json`).

Same interface as `PerfettoWriter` (see `trace_writer`). The file is
`{"traceEvents": [` followed by one event per line, each line ending in a comma,
and is closed by `{}]}`: Perfetto UI, chrome://tracing and Holistic Trace Analysis
read it. Events use `ph` X (slices, ts/dur in µs as floats), i (instants),
C (counters), s/f (flows, `bp: "e"`), M (process and thread names).

A run killed before the end leaves the file without its closing `{}]}`: every
complete line is still one whole event, so a tolerant reader drops the partial
last line and closes the brackets. The explorer's loader does (with a warning, as
for a cut .pftrace); Perfetto UI also accepts such a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from neuron_explorer.collectors.chunked_output import ChunkedOutput
from neuron_explorer.common.trace_format import ARG_METADATA_JSON, CAT_METADATA

_HEAD = b'{"displayTimeUnit": "ns", "traceEvents": [\n'
_TAIL = b"{}]}\n"
_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode


class JsonWriter(ChunkedOutput):
    """Writes Chrome-trace JSON events to `path`, buffered in chunks of about `chunk_bytes`."""

    def __init__(self, path: str, *, chunk_bytes: int = 1 << 20, uuid_base: int = 1,
                 create_on_write: bool = False, **_ignored: Any) -> None:
        super().__init__(path, chunk_bytes, create_on_write)
        self.events = 0
        self.counts: dict[str, int] = {}
        self._next_handle = uuid_base
        self._tracks: dict[int, tuple[int, int]] = {}  # handle -> (pid, tid)
        self._counter_names: dict[int, tuple[int, str]] = {}  # handle -> (pid, name)
        self._process_pid: dict[int, int] = {}
        self._next_tid: dict[int, int] = {}
        self._open: dict[int, list[dict[str, Any]]] = {}  # begun, not yet ended, per track
        self._emit(_HEAD.decode())

    # -- tracks -----------------------------------------------------------------

    def _handle(self) -> int:
        handle = self._next_handle
        self._next_handle += 1
        return handle

    def process(self, pid: int, name: str, cmdline: Sequence[str] = ()) -> int:
        handle = self._handle()
        self._process_pid[handle] = pid
        self._tracks[handle] = (pid, 0)
        self._line({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": name}})
        return handle

    def thread(self, pid: int, tid: int, name: str) -> int:
        handle = self._handle()
        self._tracks[handle] = (pid, tid)
        self._line({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": name}})
        return handle

    def track(self, name: str, process: int) -> int:
        pid = self._process_pid[process]
        tid = self._next_tid.get(pid, 1)
        self._next_tid[pid] = tid + 1
        return self.thread(pid, tid, name)

    def counter_track(self, name: str, process: int, unit: str | None = None) -> int:
        handle = self._handle()
        self._counter_names[handle] = (self._process_pid[process], name)
        return handle

    # -- events -----------------------------------------------------------------

    def _count(self, category: str, n: int = 1) -> None:
        self.events += n
        self.counts[category] = self.counts.get(category, 0) + n

    def _flows(self, pid: int, tid: int, ts: float, flow_out: Sequence[int],
               flow_in: Sequence[int]) -> None:
        for fid in flow_in:
            self._line({"ph": "f", "bp": "e", "id": int(fid), "name": "flow", "cat": "flow",
                        "pid": pid, "tid": tid, "ts": ts})
        for fid in flow_out:
            self._line({"ph": "s", "id": int(fid), "name": "flow", "cat": "flow",
                        "pid": pid, "tid": tid, "ts": ts})

    def prepare_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Args to reuse with `prepared=` (kept as a dict here)."""
        return dict(args)

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
        prepared: Mapping[str, Any] | None = None,
    ) -> None:
        pid, tid = self._tracks[track]
        event = {"ph": "X", "cat": category, "name": name, "pid": pid, "tid": tid,
                 "ts": ts / 1000, "dur": max(dur, 0) / 1000}
        if args or prepared:
            event["args"] = {**(prepared or {}), **(args or {})}
        self._line(event)
        if flow_out or flow_in:
            self._flows(pid, tid, ts / 1000, flow_out, flow_in)
        self._count(category)

    def begin(
        self,
        track: int,
        ts: int,
        name: str,
        category: str,
        args: Mapping[str, Any] | None = None,
        flow_out: Sequence[int] = (),
        flow_in: Sequence[int] = (),
        prepared: Mapping[str, Any] | None = None,
    ) -> None:
        # Written as one X event when it ends, so the duration is known.
        if prepared:
            args = {**prepared, **(args or {})}
        self._open.setdefault(track, []).append(
            {"ts": ts, "name": name, "category": category, "args": args,
             "flow_out": flow_out, "flow_in": flow_in})

    def end(self, track: int, ts: int) -> None:
        stack = self._open.get(track)
        if not stack:
            return
        b = stack.pop()
        self.slice(track, b["ts"], ts - b["ts"], b["name"], b["category"], b["args"],
                   b["flow_out"], b["flow_in"])

    def instant(
        self, track: int, ts: int, name: str, category: str, args: Mapping[str, Any] | None = None
    ) -> None:
        pid, tid = self._tracks[track]
        event = {"ph": "i", "s": "t", "cat": category, "name": name, "pid": pid, "tid": tid,
                 "ts": ts / 1000}
        if args:
            event["args"] = dict(args)
        self._line(event)
        self._count(category)

    def counter(self, track: int, ts: int, value: float) -> None:
        pid, name = self._counter_names[track]
        self._line({"ph": "C", "name": name, "pid": pid, "ts": ts / 1000,
                    "args": {"value": value}})
        self._count("counter")

    def metadata(self, track: int, ts: int, meta: Mapping[str, Any]) -> None:
        self.instant(track, ts, CAT_METADATA, CAT_METADATA,
                     {ARG_METADATA_JSON: json.dumps(meta, sort_keys=True, default=str)})

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
        prepared: tuple[Sequence[Mapping[str, Any]], np.ndarray] | None = None,
    ) -> None:
        n = len(ts)
        int_cols, int_present = {}, {}
        for k, v in (int_args or {}).items():
            if isinstance(v, tuple):  # (values, present): absent where present is False
                v, int_present[k] = v[0], np.asarray(v[1], bool).tolist()
            int_cols[k] = np.asarray(v).tolist()
        str_cols = {k: (c, np.asarray(i).tolist()) for k, (c, i) in (str_args or {}).items()}
        outs = np.asarray(flow_out).reshape(n, -1).tolist() if flow_out is not None else None
        ins = np.asarray(flow_in).reshape(n, -1).tolist() if flow_in is not None else None
        pre = ([prepared[0][i] for i in np.asarray(prepared[1]).tolist()]
               if prepared is not None else None)
        for row, (track, t, d, ni) in enumerate(zip(np.asarray(tracks).tolist(),
                                                    np.asarray(ts).tolist(),
                                                    np.asarray(dur).tolist(),
                                                    np.asarray(name_index).tolist(), strict=True)):
            args: dict[str, Any] = dict(pre[row]) if pre is not None else {}
            args.update({k: v[row] for k, v in int_cols.items()
                         if k not in int_present or int_present[k][row]})
            for k, (choices, idx) in str_cols.items():
                args[k] = choices[idx[row]]
            fo = [f for f in outs[row] if f] if outs else ()
            fi = [f for f in ins[row] if f] if ins else ()
            self.slice(track, t, d, names[ni], category, args, fo, fi)

    def counters(self, tracks: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None:
        for track, t, v in zip(np.asarray(tracks).tolist(), np.asarray(ts).tolist(),
                               np.asarray(values).tolist(), strict=True):
            self.counter(track, t, v)

    # -- output -------------------------------------------------------------------

    def _line(self, event: dict[str, Any]) -> None:
        self._emit(_dumps(event) + ",\n")

    def _encode(self, parts: list[str]) -> bytes:
        return "".join(parts).encode()

    def _finish(self) -> None:
        """End the slices still open and close the brackets."""
        for track, stack in list(self._open.items()):
            while stack:
                self.end(track, stack[-1]["ts"])
        self._emit(_TAIL.decode())

