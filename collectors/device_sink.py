"""Turns device events (ops, kernels, instructions, memory, syncs, compiles) into trace events.

Subscribed to `neuron_explorer.backend.events.hub`. The backend already removes
the time spent in these callbacks from the host clock (it measures its own
emulation interval around them), so nothing here calls `clock.exclude`.
Ops, kernels and counters are buffered as flat lists of plain values (one row after
another) and instructions as each kernel's schedule arrays (`KernelRun.kernel`), all written
in numpy batches, which is what keeps recording cheap. The buffers keep no event
objects alive: thousands of them would make the garbage collector run over and over
inside the program being recorded.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np
from neuron_explorer.backend.events import (
    CollectiveRun,
    CompileEvent,
    EventSink,
    KernelRun,
    MemoryChange,
    OpLaunch,
    SyncWait,
)
from neuron_explorer.backend.hardware import ENGINE_NAMES
from neuron_explorer.backend.source_lines import SourceLocator
from neuron_explorer.collectors.trace_writer import RecordingError
from neuron_explorer.common import op_key_codec
from neuron_explorer.common.trace_format import (
    ARG_ALGORITHM,
    ARG_BATCHED_NS,
    ARG_BYTES,
    ARG_COLLECTIVE,
    ARG_DEVICE,
    ARG_DTYPES,
    ARG_ENGINE,
    ARG_ENGINE_BUSY,
    ARG_FALLBACK,
    ARG_FLOPS,
    ARG_GRAPH_ID,
    ARG_GROUP,
    ARG_HOST_WAIT_NS,
    ARG_HW_FLOPS,
    ARG_KERNEL_ID,
    ARG_LAYOUT_COPY,
    ARG_MODULE,
    ARG_OP_ID,
    ARG_OP_KEY,
    ARG_OPCODE,
    ARG_OPS,
    ARG_PRODUCERS,
    ARG_PSUM,
    ARG_RANK,
    ARG_REASON,
    ARG_SAME_HOST_TENSOR,
    ARG_SBUF,
    ARG_SECTION,
    ARG_SECTIONS,
    ARG_SEQ,
    ARG_SHAPES,
    ARG_SOURCE,
    ARG_STEP,
    ARG_SYNC_KIND,
    ARG_TRANSFER_NS,
    ARG_WAIT_NS,
    ARG_WHOLE_BF16_NS,
    ARG_WITHIN,
    CAT_COLLECTIVE,
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
    ENGINES,
    TRACK_COLLECTIVES,
    TRACK_KERNELS,
)

if TYPE_CHECKING:
    from neuron_explorer.backend.hardware.kernel import Kernel
    from neuron_explorer.collectors.framework_hooks import FrameworkHooks
    from neuron_explorer.collectors.recorder import Recorder
    from neuron_explorer.collectors.trace_writer import TraceWriter

_BATCH = 16384  # buffered instructions / counter values before a batch is written
_FLOW_KERNEL_TO_INSTRUCTION = 1 << 62
_SIGNATURE_LIMIT = 50_000  # prepared op / kernel args kept
_KERNEL_BATCH = 4096
_OP_BATCH = 4096
# The fields of one buffered row, in order. Rows are plain values, no event objects.
_OP_ROW = ("track", "start", "dur", "op_id", "first_kernel", "kernel_count", "step",
           "name", "shapes", "dtypes", "flops", "bytes", "module", "source", "fallback",
           "device", "graph_id", "key", "producers")
# one row per kernel, appended in one `extend` (a signal between two appends would leave
# two buffers of different lengths, and the batch unwritable)
_KERNEL_ROW = ("device", "start", "end", "kernel_id", "op_id", "step", "index", "name",
               "busy", "model_flops", "flops", "bytes", "sbuf", "psum", "fallback", "sections",
               "whole_bf16", "batched", "flows")
_OP_BUFFER = _OP_BATCH * len(_OP_ROW)
_COUNTER_ROW = ("track", "ts", "value")


_INSTRUCTION_FIELDS = operator.attrgetter(
    "engine", "opcode", "start_ns", "dur_ns", "bytes", "flops")


def _factorize(values: Sequence) -> tuple[list, np.ndarray]:
    """(sorted distinct values, index of each value in them), looping in C, not Python."""
    distinct = sorted(set(values), key=str)
    index = {v: i for i, v in enumerate(distinct)}
    return distinct, np.fromiter(map(index.__getitem__, values), np.int64, len(values))


def _sections_json(kernel: Kernel | None) -> str:
    """A compiled program's sections as the user wrote them, once on its kernel slice (not on
    every instruction): JSON [[section, module, source, written, matmul dtype, matmul
    shapes], ...] for the sections that say any of the last three; "" for a kernel of one
    op."""
    sections = getattr(kernel, "sections", None)
    if not sections:
        return ""
    cwd = os.getcwd() + os.sep
    rows = [[s.name, s.module, s.source.removeprefix(cwd), *labels]
            for s in sections
            if any(labels := [getattr(s, "written", ""), getattr(s, "matmul_dtype", ""),
                              getattr(s, "matmul_shapes", "")])]
    return json.dumps(rows, separators=(",", ":")) if rows else ""


_FlowIds = TypeVar("_FlowIds", int, np.ndarray)  # one id, or int64 arrays of them


def op_flow_id(op_id: _FlowIds, kernel_index: _FlowIds) -> _FlowIds:
    """Flow from an op to its kernel_index-th kernel (docs/trace-format.md); also
    elementwise on int64 arrays."""
    return op_id | (kernel_index << 40)


_FLOW_ENGINE_INDEX = {engine: i for i, engine in enumerate(ENGINES)}  # DMA queues: 4
_ENGINE_NAME_SLOTS = np.array([_FLOW_ENGINE_INDEX.get(e, 4) for e in ENGINE_NAMES], np.int64)


def engine_index_of(engine: str) -> int:
    """Flow slot of an engine: tensor 0, vector 1, scalar 2, gpsimd 3, any DMA queue 4."""
    return _FLOW_ENGINE_INDEX.get(engine, 4)


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
        self._util: list[tuple[str, int]] | None = None
        if engine_level:
            for engine in ENGINES:
                self.engine_track(engine)
        self.hbm = self.counter(COUNTER_HBM, "bytes")
        self._collectives: int | None = None

    def collective_track(self) -> int:
        """The device's collective queue, registered on its first collective."""
        if self._collectives is None:
            self._collectives = self.writer.track(TRACK_COLLECTIVES, self.process)
        return self._collectives

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

    def util_tracks(self) -> list[tuple[str, int]]:
        """(engine, its utilisation counter track) for the compute engines."""
        if self._util is None:
            self._util = [(e, self.counter(COUNTER_UTIL.format(engine=ENGINE_TRACKS[e]), "%"))
                          for e in ENGINES]
        return self._util

    def sbuf_track(self) -> int:
        return self.counter(COUNTER_SBUF, "bytes")

    def psum_track(self) -> int:
        return self.counter(COUNTER_PSUM, "bytes")

    def counter(self, name: str, unit: str | None = None) -> int:
        track = self.counters.get(name)
        if track is None:
            track = self.counters[name] = self.writer.counter_track(name, self.process, unit)
        return track


# A compiled graph's section labels: (ops, source line, module, section name)
_SectionLabel = tuple[str, str, str, str]


class _InstructionRow(NamedTuple):
    """One kernel's buffered instructions, a column per field, until the batch is written."""

    kernel_id: int
    dev: DeviceTracks
    engine_names: Sequence[str]
    engine_index: np.ndarray  # per instruction, into engine_names
    opcode_names: Sequence[str]
    opcode_index: np.ndarray  # per instruction, into opcode_names
    start: np.ndarray
    dur: np.ndarray
    nbytes: np.ndarray
    flops: np.ndarray
    # a compiled graph's program: (section per instruction, section labels); None for a
    # kernel of one op
    program: tuple[np.ndarray, list[_SectionLabel]] | None
    sources: tuple[list[str], np.ndarray] | None  # NKI: (names, index per instruction)


class DeviceSink(EventSink):
    """The hub subscriber of one recording."""

    def __init__(self, recorder: Recorder, modules: FrameworkHooks | None = None) -> None:
        self.rec = recorder
        self.writer = recorder.writer
        self.modules = modules  # framework hooks: current module path, backward tracking
        self.devices: dict[int, DeviceTracks] = {}
        self.source = SourceLocator()
        self._kernels_seen: dict[int, int] = {}  # op_id -> kernels scheduled so far
        self._pending_compile: list[tuple[int, int, str, dict]] = []
        self._ops: list = []  # op slices waiting for their batch, rows of _OP_ROW
        self._kernels: list = []  # kernel slices, rows of _KERNEL_ROW
        # op / kernel signatures -> index into `_prepared`: (slice name, prepared args)
        self._op_signatures: dict[tuple, int] = {}
        self._kernel_signatures: dict[tuple, int] = {}
        self._prepared: list[tuple[str, object]] = []
        self._busy_maps: dict[int, dict] = {}  # id -> a kernel's busy map (kept alive)
        self._instructions: list[_InstructionRow] = []
        self._buffered_instructions = 0
        self._kernel_slots: dict[int, tuple[Kernel, list[int]]] = {}  # id(kernel) -> slots
        self._counters: list = []  # float-valued counters, rows of _COUNTER_ROW
        self._int_counters: list[int] = []  # int-valued counters, rows of _COUNTER_ROW

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
        self._kernels_seen.pop(ev.op_id, None)  # its kernels were scheduled before it
        if not rec.ops or not rec.recording:
            return
        try:
            if not rec.step_open:
                rec.ensure_step(activity=False, ts=ev.host_start_ns)
            module = modules.current_module(state) if modules is not None else ""
            # The rest waits for the batch: in a tight loop it costs a fraction of what
            # it costs between the program's own ops.
            kernels = ev.kernel_ids
            start = ev.host_start_ns
            self._ops.extend((state.track, start, ev.host_end_ns - start, ev.op_id,
                              kernels[0] if kernels else -1, len(kernels), rec.step, ev.name,
                              ev.input_shapes, ev.input_dtypes, ev.flops, ev.hbm_bytes, module,
                              self.source.locate(), ev.fallback, ev.device, ev.graph_id,
                              ev.key and ev.key[2:],  # the inputs are the shapes
                              ev.producers))
            if len(self._ops) >= _OP_BUFFER:
                self._flush_ops()
        except RecordingError as exc:
            rec.fail(exc)

    def kernel_scheduled(self, ev: KernelRun) -> None:
        rec = self.rec
        if not rec.ops or not rec.recording:
            return
        try:
            index = self._kernels_seen.get(ev.op_id, 0)
            self._kernels_seen[ev.op_id] = index + 1
            flow_out: Sequence[int] = ()
            if rec.engine:
                dev = self.device(ev.device)
                if ev.kernel is not None or ev.instructions:
                    flow_out = self._buffer_instructions(dev, ev)
                self._kernel_counters(dev, ev)
            # kernel tracks hold nothing else: the rest waits for the batch, like ops
            self._kernels.extend((ev.device, ev.start_ns, ev.end_ns, ev.kernel_id, ev.op_id,
                                  rec.step, index, ev.name, ev.engine_busy_ns, ev.model_flops,
                                  ev.flops, ev.hbm_bytes, ev.sbuf_bytes, ev.psum_bytes,
                                  ev.fallback, _sections_json(ev.kernel) if rec.engine else "",
                                  getattr(ev.kernel, "whole_bf16_ns", None) if rec.engine
                                  else None,
                                  getattr(ev.kernel, "batched_ns", None) if rec.engine
                                  else None, flow_out))
            if len(self._kernels) >= _KERNEL_BATCH * len(_KERNEL_ROW):
                self._flush_kernels()
        except RecordingError as exc:
            rec.fail(exc)

    def memory_changed(self, ev: MemoryChange) -> None:
        rec = self.rec
        if not rec.ops or not rec.recording:
            return
        try:
            dev = self.devices.get(ev.device) or self.device(ev.device)
            self._int_counters.extend((dev.hbm, ev.ts_ns, ev.in_use_bytes))
            if len(self._int_counters) >= len(_COUNTER_ROW) * _BATCH:
                self._flush_counters()
        except RecordingError as exc:
            rec.fail(exc)

    def sync_waited(self, ev: SyncWait) -> None:
        rec = self.rec
        if not rec.recording:
            return
        try:
            rec.ensure_step(activity=False, ts=ev.host_start_ns)
            args = {ARG_SYNC_KIND: ev.kind, ARG_SOURCE: self.source.locate(),
                    ARG_DEVICE: ev.device, ARG_STEP: rec.step}
            within = self.source.torch_call()  # a check inside a torch API reads on the host
            if within:
                args[ARG_WITHIN] = within
            track = rec.thread().track
            rec.write_host_slice(ev.host_start_ns, lambda: self.writer.slice(
                track, ev.host_start_ns, ev.host_end_ns - ev.host_start_ns,
                f"sync ({ev.kind})", CAT_SYNC, args))
        except RecordingError as exc:
            rec.fail(exc)

    def collective_ran(self, ev: CollectiveRun) -> None:
        """One slice per collective on the device's collective queue (few per step: written
        at once, not batched), ending the flow from its host call at op level."""
        rec = self.rec
        if not rec.recording:
            return
        try:
            rec.ensure_step(activity=False, ts=ev.arrival_ns)
            args = {ARG_COLLECTIVE: ev.collective, ARG_BYTES: ev.nbytes,
                    ARG_GROUP: str(list(ev.group)), ARG_SEQ: ev.seq,
                    ARG_ALGORITHM: ev.algorithm, ARG_WAIT_NS: ev.wait_ns,
                    ARG_HOST_WAIT_NS: ev.host_wait_ns,
                    ARG_TRANSFER_NS: ev.transfer_ns, ARG_KERNEL_ID: ev.kernel_id,
                    ARG_OP_ID: ev.op_id, ARG_RANK: ev.rank, ARG_DEVICE: ev.device,
                    ARG_STEP: rec.step}
            self.writer.slice(self.device(ev.device).collective_track(), ev.arrival_ns,
                              ev.end_ns - ev.arrival_ns, ev.collective, CAT_COLLECTIVE, args,
                              flow_in=(ev.op_id,) if rec.ops else ())
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

    def _buffer_instructions(self, dev: DeviceTracks, ev: KernelRun) -> list[int]:
        """Keep a kernel's instructions for the next batch; return the kernel's flow ids."""
        kernel = ev.kernel
        row: _InstructionRow
        if kernel is not None:  # the simulator's arrays, start times relative to the kernel
            arrays = kernel.arrays()
            engine_index = arrays["engine"]
            row = _InstructionRow(
                ev.kernel_id, dev, ENGINE_NAMES, engine_index, kernel.opcodes,
                arrays["opcode"], arrays["start"] + ev.start_ns, arrays["dur"],
                arrays["bytes"], arrays["flops"], self._program_labels(kernel),
                getattr(kernel, "instruction_sources", None))
            # the engines a kernel uses never change: compute its flow slots once
            cached = self._kernel_slots.get(id(kernel))
            if cached is None or cached[0] is not kernel:
                if len(self._kernel_slots) > _SIGNATURE_LIMIT:
                    self._kernel_slots.clear()
                slots = np.unique(_ENGINE_NAME_SLOTS[engine_index]).tolist()
                cached = self._kernel_slots[id(kernel)] = (kernel, slots)
            slots = cached[1]
        else:  # Instruction records (events built by hand)
            assert ev.instructions, "kernel_scheduled buffers only kernels with a schedule"
            engines, opcodes, starts, durs, nbytes, flops = zip(*map(_INSTRUCTION_FIELDS,
                                                                      ev.instructions), strict=True)
            engine_names, engine_index = _factorize(engines)
            opcode_names, opcode_index = _factorize(opcodes)
            row = _InstructionRow(
                ev.kernel_id, dev, engine_names, engine_index, opcode_names, opcode_index,
                np.array(starts, np.int64), np.array(durs, np.int64),
                np.array(nbytes, np.int64), np.array(flops, np.int64), None, None)
            slots = sorted({engine_index_of(e) for e in engine_names})
        self._instructions.append(row)
        self._buffered_instructions += len(row.engine_index)
        if self._buffered_instructions >= _BATCH:
            self._flush_instructions()
        base = _FLOW_KERNEL_TO_INSTRUCTION | (ev.kernel_id << 4)
        return [base | slot for slot in slots]

    @staticmethod
    def _program_labels(kernel: Kernel) -> tuple[np.ndarray, list[_SectionLabel]] | None:
        """A compiled graph's program: per instruction its section, and per section its
        (ops, source line, module inside the compiled code, section name) strings; None
        for a kernel of one op."""
        section = kernel.section
        if section is None:
            return None
        cwd = os.getcwd() + os.sep  # sources read as eager ops' do: relative to the cwd
        return section, [("+".join(s.ops), s.source.removeprefix(cwd), s.module, s.name)
                         for s in kernel.sections]

    def _kernel_counters(self, dev: DeviceTracks, ev: KernelRun) -> None:
        start, end = ev.start_ns, ev.end_ns
        scale = 100.0 / max(end - start, 1)
        busy_ns = ev.engine_busy_ns
        for engine, track in dev.util_tracks():
            busy = busy_ns.get(engine)
            if busy:
                self._counters.extend((track, start, min(100.0, busy * scale), track, end, 0.0))
        ints = self._int_counters
        if ev.sbuf_bytes:
            track = dev.sbuf_track()
            ints.extend((track, start, ev.sbuf_bytes, track, end, 0))
        if ev.psum_bytes:
            track = dev.psum_track()
            ints.extend((track, start, ev.psum_bytes, track, end, 0))
        if len(self._counters) + len(ints) >= len(_COUNTER_ROW) * _BATCH:
            self._flush_counters()

    def _flush_instructions(self) -> None:
        rows = self._instructions
        if not rows:
            return
        self._instructions = []
        self._buffered_instructions = 0
        # name tables shared by the batch: (engine, device) pairs and opcodes, each kernel's
        # indices mapped into them with one small lookup array per kernel
        engine_keys: dict[tuple[str, int], int] = {}
        devices: dict[int, DeviceTracks] = {}
        opcode_ids: dict[str, int] = {}
        engine_parts, opcode_parts, counts = [], [], []
        for r in rows:
            devices[id(r.dev)] = r.dev
            engine_map = np.array([engine_keys.setdefault((e, id(r.dev)), len(engine_keys))
                                   for e in r.engine_names], np.int64)
            opcode_map = np.array([opcode_ids.setdefault(o, len(opcode_ids))
                                   for o in r.opcode_names], np.int64)
            engine_parts.append(engine_map[r.engine_index])
            opcode_parts.append(opcode_map[r.opcode_index])
            counts.append(len(r.engine_index))
        eidx = np.concatenate(engine_parts)
        name_index = np.concatenate(opcode_parts)
        ts = np.concatenate([r.start for r in rows]).astype(np.int64, copy=False)
        dur = np.concatenate([r.dur for r in rows]).astype(np.int64, copy=False)
        nbytes = np.concatenate([r.nbytes for r in rows]).astype(np.int64, copy=False)
        flops = np.concatenate([r.flops for r in rows]).astype(np.int64, copy=False)
        kernel_ids = np.repeat(np.array([r.kernel_id for r in rows], np.int64), counts)
        # a compiled graph's instructions: the section (op, source line, module) of each
        labels: dict[tuple[str, str, str, str], int] = {}
        label_parts = []
        for row, count in zip(rows, counts, strict=True):
            if row.program is None:
                label_parts.append(np.full(count, -1, np.int64))
            else:
                section, sections = row.program
                local = np.array([labels.setdefault(x, len(labels)) for x in sections], np.int64)
                label_parts.append(local[section])
        label = np.concatenate(label_parts)
        # kernel source lines (NKI kernels): one name table, "" for instructions without
        source_ids: dict[str, int] = {"": 0}
        source_parts = []
        for r, count in zip(rows, counts, strict=True):
            if r.sources is None:
                source_parts.append(np.zeros(count, np.int64))
            else:
                names, index = r.sources
                lookup = np.array([source_ids.setdefault(n, len(source_ids)) for n in names],
                                  np.int64)
                source_parts.append(lookup[index])
        sources = np.concatenate(source_parts) if len(source_ids) > 1 else None
        engine_list = [e for e, _ in engine_keys]
        tracks_of = np.array([devices[d].engine_track(e) for e, d in engine_keys], np.int64)
        slot_of = np.array([engine_index_of(e) for e in engine_list], np.int64)
        opcode_list = list(opcode_ids)
        # the first instruction of each kernel on each engine (any DMA queue for DMA) ends
        # the kernel's flow there
        slots = slot_of[eidx]
        _, first = np.unique(kernel_ids * 8 + slots, return_index=True)
        flow = np.zeros(len(ts), np.uint64)
        flow[first] = (np.uint64(_FLOW_KERNEL_TO_INSTRUCTION)
                       | (kernel_ids[first].astype(np.uint64) << np.uint64(4))
                       | slots[first].astype(np.uint64))
        # time order per track (an enclosing instruction before the one it encloses)
        order = np.lexsort((-dur, ts, eidx))
        columns = {
            "tracks": tracks_of[eidx][order], "ts": ts[order], "dur": dur[order],
            "name_index": name_index[order], "kernel": kernel_ids[order],
            "bytes": nbytes[order], "flops": flops[order], "flow": flow[order],
            "engine": eidx[order], "label": label[order],
        }
        label_list = list(labels)
        if sources is not None:
            columns["source"] = sources[order]
        is_dma = np.array([e not in ENGINE_TRACKS for e in engine_list], bool)[columns["engine"]]
        in_program = columns["label"] >= 0
        for category, kind in ((CAT_INSTRUCTION, ~is_dma), (CAT_DMA, is_dma)):
            for program in (False, True):
                keep = kind & (in_program if program else ~in_program)
                if not keep.any():
                    continue
                c = {k: v[keep] for k, v in columns.items()} if not keep.all() else columns
                strings = {ARG_ENGINE: (engine_list, c["engine"]),
                           ARG_OPCODE: (opcode_list, c["name_index"])}
                if program:
                    for i, key in enumerate((ARG_OPS, ARG_SOURCE, ARG_MODULE, ARG_SECTION)):
                        strings[key] = ([x[i] for x in label_list], c["label"])
                elif "source" in c:  # an NKI kernel's lines
                    strings[ARG_SOURCE] = (list(source_ids), c["source"])
                self.writer.slices(
                    c["tracks"], c["ts"], c["dur"], opcode_list, c["name_index"], category,
                    {ARG_KERNEL_ID: c["kernel"], ARG_BYTES: c["bytes"], ARG_FLOPS: c["flops"]},
                    strings, flow_in=c["flow"],
                )

    # -- op and kernel batches ---------------------------------------------------------

    def _signature_values(self, keys: list[tuple], known: dict[tuple, int],
                          args_of: Callable[[tuple], tuple[str, dict]]) -> np.ndarray:
        """Each row's signature (what repeats from one step to the next: name and the args
        other than ids and step) as an index into `self._prepared`, whose args are encoded
        once per signature."""
        values = list(map(known.get, keys))
        for i in [i for i, value in enumerate(values) if value is None]:
            key = keys[i]
            if key not in known:  # new in this batch (a batch may hold it several times)
                name, args = args_of(key)
                self._prepared.append((name, self.writer.prepare_args(args)))
                known[key] = len(self._prepared) - 1
            values[i] = known[key]
        return np.array(values, np.int64)

    @staticmethod
    def _op_args(key: tuple) -> tuple[str, dict]:
        (name, shapes, dtypes, flops, nbytes, module, source, fallback, device, graph_id,
         op_key, producers) = key
        args = {
            ARG_SHAPES: str([list(s) for s in shapes]),
            ARG_DTYPES: "[" + ", ".join(dtypes) + "]",
            ARG_FLOPS: flops,
            ARG_BYTES: nbytes,
            ARG_MODULE: module,
            ARG_SOURCE: source,
            ARG_FALLBACK: fallback,
            ARG_DEVICE: device,
        }
        if graph_id is not None:
            args[ARG_GRAPH_ID] = graph_id
        if op_key:  # (outputs, attrs): what the what-if replay lowers again
            args[ARG_OP_KEY] = op_key_codec.encode(*op_key)
            if (ARG_SAME_HOST_TENSOR, True) in op_key[1]:
                args[ARG_SAME_HOST_TENSOR] = True
            if (ARG_LAYOUT_COPY, True) in op_key[1]:
                args[ARG_LAYOUT_COPY] = True
        if any(producers):
            args[ARG_PRODUCERS] = json.dumps(list(producers), separators=(",", ":"))
        return name, args

    def _kernel_args(self, key: tuple) -> tuple[str, dict]:
        (busy_id, name, model_flops, flops, nbytes, sbuf, psum, fallback, sections, bf16,
         batched) = key
        args = {
            ARG_FLOPS: model_flops,
            ARG_HW_FLOPS: flops,
            ARG_BYTES: nbytes,
            ARG_ENGINE_BUSY: json.dumps(self._busy_maps[busy_id], sort_keys=True),
            ARG_SBUF: sbuf,
            ARG_PSUM: psum,
            ARG_FALLBACK: fallback,
        }
        if sections:
            args[ARG_SECTIONS] = sections
        if bf16 is not None:
            args[ARG_WHOLE_BF16_NS] = bf16
        if batched is not None:
            args[ARG_BATCHED_NS] = batched
        return name, args

    def _forget_signatures(self) -> None:
        """Bound the caches (rows carry their own fields, so nothing buffered needs them)."""
        if len(self._prepared) >= _SIGNATURE_LIMIT or len(self._busy_maps) >= _SIGNATURE_LIMIT:
            self._prepared.clear()
            self._op_signatures.clear()
            self._kernel_signatures.clear()
            self._busy_maps.clear()

    def _signature_columns(self, signatures: np.ndarray) -> tuple[list, np.ndarray, list]:
        """(names, the one each row uses, prepared args, indexed alike) of a batch."""
        used, index = np.unique(signatures, return_inverse=True)
        names, prepared = zip(*(self._prepared[i] for i in used.tolist()), strict=True)
        return list(names), index, list(prepared)

    @staticmethod
    def _take(buffer: list, fields: tuple[str, ...]) -> dict[str, list]:
        """A flat row buffer as one list per field."""
        width = len(fields)
        columns = {field: buffer[i::width] for i, field in enumerate(fields)}
        buffer.clear()
        return columns

    def _flush_kernels(self) -> None:
        if not self._kernels:
            return
        self._forget_signatures()
        c = self._take(self._kernels, _KERNEL_ROW)
        flows = c["flows"]
        # Runs of one kernel share its busy map: kept alive here, its id stands for it.
        busy_maps = self._busy_maps
        for busy in c["busy"]:
            busy_maps.setdefault(id(busy), busy)
        keys = list(zip(map(id, c["busy"]), c["name"], c["model_flops"], c["flops"],
                        c["bytes"], c["sbuf"], c["psum"], c["fallback"], c["sections"],
                        c["whole_bf16"], c["batched"], strict=True))
        signatures = self._signature_values(keys, self._kernel_signatures, self._kernel_args)
        lanes = []  # in launch order: lanes fill as kernels arrive
        for device, start, end in zip(c["device"], c["start"], c["end"], strict=True):
            lanes.append(self.device(device).kernel_lane(start, end))
        start = np.array(c["start"], np.int64)
        flow_out = np.zeros((len(flows), max(1, max(map(len, flows)))), np.uint64)
        for i, ids in enumerate(flows):
            if ids:
                flow_out[i, : len(ids)] = ids
        op_ids = np.array(c["op_id"], np.int64)
        names, name_index, prepared = self._signature_columns(signatures)
        self.writer.slices(
            np.array(lanes, np.int64), start, np.array(c["end"], np.int64) - start, names,
            name_index, CAT_KERNEL,
            {ARG_KERNEL_ID: np.array(c["kernel_id"], np.int64), ARG_OP_ID: op_ids,
             ARG_STEP: np.array(c["step"], np.int64)},
            flow_out=flow_out,
            flow_in=op_flow_id(op_ids, np.array(c["index"], np.int64)).astype(np.uint64),
            prepared=(prepared, name_index),
        )

    def _flush_ops(self) -> None:
        """Write the buffered op slices as one batch.

        Op slices share the host thread's track with module, sync and step slices written
        as they happen; readers (Perfetto, our loader) order each track by time, so a
        batch written later still nests where its timestamps put it."""
        if not self._ops:
            return
        self._forget_signatures()
        c = self._take(self._ops, _OP_ROW)
        keys = list(zip(c["name"], c["shapes"], c["dtypes"], c["flops"], c["bytes"],
                        c["module"], c["source"], c["fallback"], c["device"], c["graph_id"],
                        c["key"], c["producers"], strict=True))
        signatures = self._signature_values(keys, self._op_signatures, self._op_args)
        op_ids = np.array(c["op_id"], np.int64)
        counts = np.array(c["kernel_count"], np.int64)
        first_kernel = np.array(c["first_kernel"], np.int64)
        # one flow per kernel: the op id itself when there is one kernel (docs/trace-format.md)
        flow_out = np.zeros((len(op_ids), max(1, int(counts.max()))), np.uint64)
        single = counts == 1
        flow_out[single, 0] = op_ids[single]
        for i in np.flatnonzero(counts > 1):
            flow_out[i, : counts[i]] = [op_flow_id(int(op_ids[i]), j) for j in range(counts[i])]
        names, name_index, prepared = self._signature_columns(signatures)
        # one batch in launch order: ops at the same timestamp keep their order in the file
        self.writer.slices(
            np.array(c["track"], np.int64), np.array(c["start"], np.int64),
            np.array(c["dur"], np.int64), names, name_index, CAT_OP,
            {ARG_OP_ID: op_ids, ARG_STEP: np.array(c["step"], np.int64),
             ARG_KERNEL_ID: (first_kernel, first_kernel >= 0)},  # views have no kernel
            flow_out=flow_out, prepared=(prepared, name_index),
        )

    def _flush_counters(self) -> None:
        for buffer, dtype in ((self._counters, np.float64), (self._int_counters, np.int64)):
            if buffer:
                c = self._take(buffer, _COUNTER_ROW)
                self.writer.counters(np.array(c["track"], np.int64), np.array(c["ts"], np.int64),
                                     np.array(c["value"], dtype))

    def flush(self) -> None:
        """Write everything buffered (at the end of the recording or its window)."""
        try:
            self._flush_compile(self.rec.main.track, force=True)
            self._flush_ops()
            self._flush_kernels()
            self._flush_instructions()
            self._flush_counters()
        except RecordingError as exc:
            self.rec.fail(exc)
