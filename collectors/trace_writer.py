"""What every trace writer offers, and how to open one for a path and format.

Both writers (`PerfettoWriter` for `.pftrace`, `JsonWriter` for Chrome-trace JSON)
take the same calls, so the recorder never cares which one it feeds:

    w = open_writer("run.pftrace", "pftrace")
    host = w.process(pid, "python train.py", cmdline=[...])     # -> track handle
    main = w.thread(pid, tid, "MainThread")
    dev = w.process(device_pid, "neuron:0 (trn2)")
    kernels = w.track("Kernels", dev)                             # named slice track
    hbm = w.counter_track("HBM in use (bytes)", dev, unit="bytes")
    w.slice(main, ts, dur, "aten::mm", "op", {"flops": 2048}, flow_out=[op_id])
    w.begin(main, ts, "step 3", "step", {"step": 3}); ...; w.end(main, ts2)
    w.instant(main, ts, "graph_break", "graph_break", {"reason": "..."})
    w.counter(hbm, ts, 1 << 20)
    w.slices(...)  /  w.counters(...)    # numpy batches (instructions, counters)
    w.metadata(main, ts, {...})
    w.close()

Times are int ns on the host clock. Args values are int, float, bool or str.
Flows: `flow_out` ids start (or continue) a flow at a slice, `flow_in` ids end it.
`prepared = w.prepare_args({...})` encodes args once; `slice(..., prepared=prepared,
args={...})` then adds only the args that change (ids, step): the hot path for ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from neuron_explorer.common.errors import NeuronExplorerError

FORMATS = ("pftrace", "json")


class RecordingError(NeuronExplorerError):
    """Recording cannot go on: the output cannot be written (full disk, bad path)."""


class TraceWriter(Protocol):
    """The calls both trace writers accept (see the module docstring)."""

    path: str
    events: int
    counts: dict[str, int]
    closed: bool  # closed, discarded or abandoned by a failed write: nothing more is written

    def process(self, pid: int, name: str, cmdline: Sequence[str] = ()) -> int: ...
    def thread(self, pid: int, tid: int, name: str) -> int: ...
    def track(self, name: str, process: int) -> int: ...
    def counter_track(self, name: str, process: int, unit: str | None = None) -> int: ...
    def prepare_args(self, args: Mapping[str, Any]) -> Any: ...
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
        prepared: Any = None,
    ) -> None: ...
    def begin(
        self,
        track: int,
        ts: int,
        name: str,
        category: str,
        args: Mapping[str, Any] | None = None,
        flow_out: Sequence[int] = (),
        flow_in: Sequence[int] = (),
        prepared: Any = None,
    ) -> None: ...
    def end(self, track: int, ts: int) -> None: ...
    def instant(
        self, track: int, ts: int, name: str, category: str, args: Mapping[str, Any] | None = None
    ) -> None: ...
    def counter(self, track: int, ts: int, value: float) -> None: ...
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
        prepared: tuple[Sequence[Any], np.ndarray] | None = None,
    ) -> None: ...  # rows in order; an int arg as (values, present) is left out where absent
    def counters(self, tracks: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None: ...
    def metadata(self, track: int, ts: int, meta: Mapping[str, Any]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def discard(self) -> None: ...


def open_writer(path: str, fmt: str, **options: Any) -> TraceWriter:
    """Open a trace writer for `path` in `fmt` ("pftrace" or "json")."""
    if fmt == "pftrace":
        from neuron_explorer.collectors.perfetto_writer import PerfettoWriter

        return PerfettoWriter(path, **options)
    if fmt == "json":
        from neuron_explorer.collectors.json_writer import JsonWriter

        return JsonWriter(path, **options)
    raise RecordingError(f"unknown trace format {fmt!r}: use one of {', '.join(FORMATS)}")


def open_output(path: str) -> Any:
    """Open `path` for binary writing, or raise one clear RecordingError."""
    try:
        return open(path, "wb")
    except OSError as exc:
        raise RecordingError(
            f"cannot write the trace to {path}: {exc.strerror or exc}; "
            "choose a writable path with -o/--output"
        ) from None


def write_failed(path: str, exc: OSError) -> RecordingError:
    """The error to raise when writing the trace fails part way (e.g. the disk is full)."""
    return RecordingError(
        f"stopped recording: cannot write to {path} ({exc.strerror or exc}); "
        "the trace holds what was written before; free space or pick another -o/--output"
    )
