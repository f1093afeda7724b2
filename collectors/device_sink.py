"""Turns the device's events (ops, kernels, instructions, memory, syncs, compiles) into trace events.

Subscribed to `neuron_explorer.backend.events.hub`. The backend already removes
the time spent in these callbacks from the host clock (it measures its own
emulation interval around them), so nothing here calls `clock.exclude`.
Instructions and counters are buffered as plain tuples and written in numpy
batches, which is what keeps engine-level recording cheap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.backend.events import CompileEvent, KernelRun, MemoryChange, OpLaunch, SyncWait
from neuron_explorer.collectors.source_lines import SourceLocator
from neuron_explorer.collectors.trace_writer import RecordingError
from neuron_explorer.trace_format import (
    ARG_BYTES,
    ARG_DEVICE,
    ARG_DTYPES,
    ARG_ENGINE,
    ARG_ENGINE_BUSY,
    ARG_FALLBACK,
    ARG_FLOPS,
    ARG_GRAPH_ID,
    ARG_HW_FLOPS,
    ARG_KERNEL_ID,
    ARG_MODULE,
    ARG_OP_ID,
    ARG_OPCODE,
    ARG_PSUM,
    ARG_REASON,
    ARG_SBUF,
    ARG_SHAPES,
    ARG_SOURCE,
    ARG_STEP,
    ARG_SYNC_KIND,
    CAT_COMPILE,
    CAT_DMA,
    CAT_GRAPH_BREAK,
    CAT_INSTRUCTION,
    CAT_KERNEL,
    CAT_OP,
    CAT_RECOMPILE,
    CAT_SYNC,
    COUNTER_HBM,
    COUNTER_PSUM,
    COUNTER_SBUF,
    COUNTER_UTIL,
    DEVICE_PROCESS,
    DMA_TRACK,
    ENGINE_TRACKS,
    TRACK_KERNELS,
)

if TYPE_CHECKING:
    from neuron_explorer.collectors.recorder import Recorder
    from neuron_explorer.collectors.trace_writer import TraceWriter

ENGINES = ("tensor", "vector", "scalar", "gpsimd")
_BATCH = 16384  # buffered instructions / counter values before a batch is written
_FLOW_KERNEL_TO_INSTRUCTION = 1 << 62


def op_flow_id(op_id: int, kernel_index: int) -> int:
    """Flow from an op to its kernel_index-th kernel (docs/trace-format.md)."""
    return op_id | (kernel_index << 40)


def engine_index(engine: str) -> int:
    if engine in ENGINES:
        return ENGINES.index(engine)
    return 4 + (_dma_queue(engine) % 12)


def kernel_flow_id(kernel_id: int, engine: str) -> int:
    """Flow from a kernel to its first instruction on `engine`."""
    return _FLOW_KERNEL_TO_INSTRUCTION | (kernel_id << 4) | engine_index(engine)


def _dma_queue(engine: str) -> int:
    try:
        return int(engine.partition(".")[2] or 0)
    except ValueError:
        return 0


class DeviceTracks:
    """One device's process and tracks, registered on first use."""

    def __init__(self, writer: TraceWriter, pid: int, index: int, preset: str,
                 engine_level: bool) -> None:
        self.writer = writer
        self.process = writer.process(pid, DEVICE_PROCESS.format(index=index, preset=preset))
        self.kernel_lanes: list[int] = [writer.track(TRACK_KERNELS, self.process)]
        self.lane_end: list[int] = [-1]
        self.engines: dict[str, int] = {}
        self.counters: dict[str, int] = {}
        if engine_level:
            for engine in ENGINES:
                self.engine_track(engine)
        self.hbm = self.counter(COUNTER_HBM, "bytes")

    def kernel_lane(self, start: int, end: int) -> int:
        """A kernel track free at `start` (overlapping kernels go to extra lanes)."""
        for i, last_end in enumerate(self.lane_end):
            if start >= last_end:
                self.lane_end[i] = end
                return self.kernel_lanes[i]
        track = self.writer.track(f"{TRACK_KERNELS} {len(self.kernel_lanes) + 1}", self.process)
        self.kernel_lanes.append(track)
        self.lane_end.append(end)
        return track

    def engine_track(self, engine: str) -> int:
        track = self.engines.get(engine)
        if track is None:
            if engine in ENGINE_TRACKS:
                name = ENGINE_TRACKS[engine]
            else:
                name = DMA_TRACK.format(queue=_dma_queue(engine))
            track = self.engines[engine] = self.writer.track(name, self.process)
        return track

    def counter(self, name: str, unit: str | None = None) -> int:
        track = self.counters.get(name)
        if track is None:
            track = self.counters[name] = self.writer.counter_track(name, self.process, unit)
        return track


class DeviceSink:
    """The hub subscriber of one recording."""

    def __init__(self, recorder: Recorder, modules: object | None = None) -> None:
        self.rec = recorder
        self.writer = recorder.writer
        self.modules = modules  # framework hooks: current module path, backward tracking
        self.devices: dict[int, DeviceTracks] = {}
        self.source = SourceLocator()
        self._kernels_seen: dict[int, int] = {}  # op_id -> kernels scheduled so far
        self._pending_compile: list[tuple[int, int, str, dict]] = []
        self._shape_text: dict[tuple, str] = {}
        self._dtype_text: dict[tuple, str] = {}
        self._instructions: list[tuple] = []  # (track, start, dur, opcode, bytes, flops, kid, flow, dma)
        self._counters: list[tuple[int, int, float]] = []  # (track, ts, value)
        self._int_counters: list[tuple[int, int, int]] = []

    # -- tracks ---------------------------------------------------------------------

    def device(self, index: int) -> DeviceTracks:
        tracks = self.devices.get(index)
        if tracks is None:
            from neuron_explorer.collectors.recorder import hardware_preset

            pid = (1 << 30) + (self.rec.pid % (1 << 25)) * 16 + index % 16
            tracks = DeviceTracks(self.writer, pid, index, hardware_preset()[0], self.rec.engine)
            self.devices[index] = tracks
        return tracks

    # -- hub callbacks ------------------------------------------------------------------

    def op_launched(self, ev: OpLaunch) -> None:
        rec = self.rec
        modules = self.modules
        state = rec.thread_for(ev.thread_id)
        if modules is not None:
            modules.before_op(ev, state)  # backward module slices follow the autograd node
        if not rec.ops or not rec.recording:
            self._kernels_seen.pop(ev.op_id, None)
            return
        try:
            rec.ensure_step()
            shapes = self._shape_text.get(ev.input_shapes)
            if shapes is None:
                shapes = self._shape_text[ev.input_shapes] = str(
                    [list(s) for s in ev.input_shapes])
            dtypes = self._dtype_text.get(ev.input_dtypes)
            if dtypes is None:
                dtypes = self._dtype_text[ev.input_dtypes] = "[" + ", ".join(ev.input_dtypes) + "]"
            args = {
                ARG_OP_ID: ev.op_id,
                ARG_KERNEL_ID: ev.kernel_ids[0] if ev.kernel_ids else -1,
                ARG_SHAPES: shapes,
                ARG_DTYPES: dtypes,
                ARG_FLOPS: ev.flops,
                ARG_BYTES: ev.hbm_bytes,
                ARG_MODULE: modules.current_module(state) if modules is not None else "",
                ARG_SOURCE: self.source.locate(),
                ARG_FALLBACK: ev.fallback,
                ARG_DEVICE: ev.device,
                ARG_STEP: rec.step,
            }
            if ev.graph_id is not None:
                args[ARG_GRAPH_ID] = ev.graph_id
            flows = [op_flow_id(ev.op_id, i) for i in range(len(ev.kernel_ids))]
            self._kernels_seen.pop(ev.op_id, None)
            self.writer.slice(state.track, ev.host_start_ns, ev.host_end_ns - ev.host_start_ns,
                              ev.name, CAT_OP, args, flow_out=flows)
        except RecordingError as exc:
            rec.fail(exc)

    def kernel_scheduled(self, ev: KernelRun) -> None:
        rec = self.rec
        if not rec.ops or not rec.recording:
            return
        try:
            index = self._kernels_seen.get(ev.op_id, 0)
            self._kernels_seen[ev.op_id] = index + 1
            dev = self.device(ev.device)
            lane = dev.kernel_lane(ev.start_ns, ev.end_ns)
            args = {
                ARG_KERNEL_ID: ev.kernel_id,
                ARG_OP_ID: ev.op_id,
                ARG_FLOPS: ev.model_flops,
                ARG_HW_FLOPS: ev.flops,
                ARG_BYTES: ev.hbm_bytes,
                ARG_ENGINE_BUSY: json.dumps(ev.engine_busy_ns, sort_keys=True),
                ARG_SBUF: ev.sbuf_bytes,
                ARG_PSUM: ev.psum_bytes,
                ARG_FALLBACK: ev.fallback,
                ARG_STEP: rec.step,
            }
            instructions = ev.instructions if rec.engine else None
            flow_out = ()
            if instructions:
                flow_out = self._buffer_instructions(dev, ev.kernel_id, instructions)
            self.writer.slice(lane, ev.start_ns, ev.end_ns - ev.start_ns, ev.name, CAT_KERNEL,
                              args, flow_out=flow_out, flow_in=(op_flow_id(ev.op_id, index),))
            if rec.engine:
                self._kernel_counters(dev, ev)
        except RecordingError as exc:
            rec.fail(exc)

    def memory_changed(self, ev: MemoryChange) -> None:
        rec = self.rec
        if not rec.ops or not rec.recording:
            return
        try:
            self._int_counters.append((self.device(ev.device).hbm, ev.ts_ns, ev.in_use_bytes))
            if len(self._int_counters) >= _BATCH:
                self._flush_counters()
        except RecordingError as exc:
            rec.fail(exc)

    def sync_waited(self, ev: SyncWait) -> None:
        rec = self.rec
        if not rec.recording:
            return
        try:
            rec.ensure_step()
            args = {ARG_SYNC_KIND: ev.kind, ARG_SOURCE: self.source.locate(),
                    ARG_DEVICE: ev.device, ARG_STEP: rec.step}
            self.writer.slice(rec.thread().track, ev.host_start_ns,
                              ev.host_end_ns - ev.host_start_ns, f"sync ({ev.kind})", CAT_SYNC,
                              args)
        except RecordingError as exc:
            rec.fail(exc)

    def compile_event(self, ev: CompileEvent) -> None:
        rec = self.rec
        if not rec.recording:
            return
        try:
            rec.ensure_step()
            args = {k: v if isinstance(v, (int, float, bool, str)) else str(v)
                    for k, v in ev.args.items() if v is not None}
            args[ARG_STEP] = rec.step
            track = rec.thread().track
            if ev.kind in ("graph_break", "recompile"):
                args.setdefault(ARG_REASON, "")
                args.setdefault(ARG_SOURCE, "")
                category = CAT_GRAPH_BREAK if ev.kind == "graph_break" else CAT_RECOMPILE
                self.writer.instant(track, ev.start_ns, ev.name or ev.kind, category, args)
                return
            args["kind"] = ev.kind
            self._pending_compile.append((ev.start_ns, ev.end_ns, ev.name or ev.kind, args))
            self._flush_compile(track)
        except RecordingError as exc:
            rec.fail(exc)

    def _flush_compile(self, track: int, force: bool = False) -> None:
        """Compile spans arrive innermost first (each is sent when it ends): hold them
        until the enclosing span arrives, then write them outermost first so they nest."""
        pending = self._pending_compile
        newest = pending[-1] if pending else None
        if newest is None:
            return
        if force or all(newest[0] <= s and e <= newest[1] for s, e, _, _ in pending):
            for start, end, name, args in sorted(pending, key=lambda p: (p[0], -p[1])):
                self.writer.slice(track, start, end - start, name, CAT_COMPILE, args)
            pending.clear()

    # -- engine level ------------------------------------------------------------------

    def _buffer_instructions(self, dev: DeviceTracks, kernel_id: int,
                             instructions: Sequence) -> list[int]:
        first: dict[str, int] = {}
        buf = self._instructions
        engine_track = dev.engine_track
        for ins in instructions:
            engine = ins.engine
            flow = 0
            if engine not in first:
                flow = first[engine] = kernel_flow_id(kernel_id, engine)
            buf.append((engine_track(engine), ins.start_ns, ins.dur_ns, ins.opcode, ins.bytes,
                        ins.flops, kernel_id, flow, engine))
        if len(buf) >= _BATCH:
            self._flush_instructions()
        return list(first.values())

    def _kernel_counters(self, dev: DeviceTracks, ev: KernelRun) -> None:
        counters = self._counters
        dur = max(ev.end_ns - ev.start_ns, 1)
        for engine in ENGINES:
            busy = ev.engine_busy_ns.get(engine, 0)
            if busy:
                track = dev.counter(COUNTER_UTIL.format(engine=ENGINE_TRACKS[engine]), "%")
                counters.append((track, ev.start_ns, min(100.0, 100.0 * busy / dur)))
                counters.append((track, ev.end_ns, 0.0))
        ints = self._int_counters
        if ev.sbuf_bytes:
            ints.append((dev.counter(COUNTER_SBUF, "bytes"), ev.start_ns, ev.sbuf_bytes))
            ints.append((dev.counter(COUNTER_SBUF, "bytes"), ev.end_ns, 0))
        if ev.psum_bytes:
            ints.append((dev.counter(COUNTER_PSUM, "bytes"), ev.start_ns, ev.psum_bytes))
            ints.append((dev.counter(COUNTER_PSUM, "bytes"), ev.end_ns, 0))
        if len(counters) + len(ints) >= _BATCH:
            self._flush_counters()

    def _flush_instructions(self) -> None:
        buf = self._instructions
        if not buf:
            return
        buf.sort(key=lambda r: (r[0], r[1]))  # time order per track, as slices must be
        tracks, starts, durs, opcodes, nbytes, flops, kids, flows, engines = zip(*buf)
        buf.clear()
        names: dict[str, int] = {}
        name_index = np.fromiter((names.setdefault(o, len(names)) for o in opcodes), np.int64,
                                 len(opcodes))
        engine_names: dict[str, int] = {}
        engine_index_ = np.fromiter((engine_names.setdefault(e, len(engine_names))
                                     for e in engines), np.int64, len(engines))
        is_dma = np.array([e not in ENGINE_TRACKS for e in engine_names], bool)[engine_index_]
        columns = {
            "tracks": np.array(tracks, np.int64),
            "ts": np.array(starts, np.int64),
            "dur": np.array(durs, np.int64),
            "name_index": name_index,
            "kernel": np.array(kids, np.int64),
            "bytes": np.array(nbytes, np.int64),
            "flops": np.array(flops, np.int64),
            "flow": np.array(flows, np.uint64),
            "engine": engine_index_,
        }
        opcode_list = list(names)
        engine_list = list(engine_names)
        for category, rows in ((CAT_INSTRUCTION, ~is_dma), (CAT_DMA, is_dma)):
            if not rows.any():
                continue
            c = {k: v[rows] for k, v in columns.items()}
            self.writer.slices(
                c["tracks"], c["ts"], c["dur"], opcode_list, c["name_index"], category,
                {ARG_KERNEL_ID: c["kernel"], ARG_BYTES: c["bytes"], ARG_FLOPS: c["flops"]},
                {ARG_ENGINE: (engine_list, c["engine"]), ARG_OPCODE: (opcode_list, c["name_index"])},
                flow_in=c["flow"],
            )

    def _flush_counters(self) -> None:
        for buf in (self._counters, self._int_counters):
            if buf:
                tracks, ts, values = zip(*buf)
                buf.clear()
                dtype = np.float64 if buf is self._counters else np.int64
                self.writer.counters(np.array(tracks, np.int64), np.array(ts, np.int64),
                                     np.array(values, dtype))

    def flush(self) -> None:
        """Write everything buffered (at the end of the recording or its window)."""
        try:
            self._flush_compile(self.rec.main.track, force=True)
            self._flush_instructions()
            self._flush_counters()
        except RecordingError as exc:
            self.rec.fail(exc)
