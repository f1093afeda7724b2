"""Events the backend exposes to whatever collector subscribes.

The backend knows nothing of collectors: it calls the methods of the subscribed
sinks. When nothing is subscribed, `hub.active` is False and the hot path pays one
attribute test per op. All times are ns on the host clock's timeline
(`neuron_explorer.backend.clock`), which the device clock shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_explorer.backend.hardware.kernel import Kernel


@dataclass(slots=True)
class OpLaunch:
    """One op sent to a `neuron` device (eager dispatch, or one launch of a compiled graph)."""

    op_id: int  # correlation id, unique in the process; links op -> kernel
    name: str  # "aten::addmm", or "graph:3" for a compiled graph launch
    device: int
    host_start_ns: int  # host clock when dispatch began
    host_end_ns: int  # host clock when the launch returned to Python
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    flops: int  # model FLOPs (multiply-add = 2)
    hbm_bytes: int  # bytes read + written in HBM
    fallback: bool  # ran on the host (no device lowering)
    kernel_ids: tuple[int, ...]  # kernels this op became; empty for view/metadata ops
    thread_id: int
    graph_id: int | None = None  # compiled graph this launch ran, if any
    # the runtime's op key (name, input and output (shape, dtype)s, attrs) the device
    # lowered: what a what-if replay lowers again; None for compiled-graph launches
    key: tuple | None = None
    # per tensor input: how many op ids back the op that made it was (0: not a recorded
    # op's result): the data flow a compiled what-if replay fuses along
    producers: tuple[int, ...] = ()


@dataclass(slots=True)
class Instruction:
    """One instruction (or DMA transfer) executed by an engine or DMA queue."""

    engine: str  # "tensor", "vector", "scalar", "gpsimd", or "dma.<queue>"
    opcode: str  # "MultiplyMoving", "LoadStationary", "TensorTensor", "Activation", "DmaLoad", ...
    start_ns: int  # device clock, absolute
    dur_ns: int
    bytes: int = 0
    flops: int = 0


@dataclass(slots=True)
class KernelRun:
    """A kernel placed on the device timeline by the simulator."""

    kernel_id: int
    op_id: int  # the OpLaunch that launched it
    name: str  # e.g. "matmul_bf16_128x512x512" or "fused_add_gelu"
    device: int
    launch_ns: int  # host clock at launch
    start_ns: int  # device clock
    end_ns: int
    flops: int  # FLOPs the hardware executed (padding included)
    model_flops: int  # FLOPs the op needed
    hbm_bytes: int
    # per engine ("tensor", "vector", "scalar", "gpsimd", "dma"); the kernel's own map,
    # shared by every run of that kernel: read it, never change it
    engine_busy_ns: dict[str, int]
    sbuf_bytes: int  # peak SBUF footprint of the kernel
    psum_bytes: int  # peak PSUM footprint of the kernel
    fallback: bool = False
    # Filled only when `hub.want_instructions` is set (engine-level recording).
    instructions: list[Instruction] | None = None
    # The simulated kernel (its `arrays()` and `opcodes`, start times relative to
    # `start_ns`), set only when `hub.want_instruction_arrays` is: bulk consumers read
    # the schedule as numpy arrays instead of one Instruction per instruction.
    kernel: Kernel | None = None


@dataclass(slots=True)
class MemoryChange:
    """HBM allocation or release on a device."""

    device: int
    ts_ns: int
    delta_bytes: int  # > 0 allocated, < 0 freed
    in_use_bytes: int  # after the change
    op_id: int | None  # op that caused it, if known


@dataclass(slots=True)
class SyncWait:
    """The host waited for the device (`.item()`, `.cpu()`, printing, synchronize)."""

    device: int
    kind: str  # "item", "cpu", "tolist", "print", "synchronize", "copy_to_host"
    host_start_ns: int
    host_end_ns: int  # after the wait: host clock jumped to the device's finish


@dataclass(slots=True)
class CompileEvent:
    """A torch.compile span or instant (dynamo, aot_autograd, neuron compiler, graph break,
    recompile)."""

    kind: str  # "dynamo", "aot_autograd", "neuron_compile", "graph_break", "recompile"
    name: str
    start_ns: int
    end_ns: int  # == start_ns for instants (graph_break, recompile)
    args: dict = field(default_factory=dict)  # reason, source, graph_id, op_count, kernels, guard


@dataclass(slots=True)
class CollectiveRun:
    """A collective placed on a device's collective queue (backend/distributed).

    It waits from `arrival_ns` (this rank reached it) to `start_ns` (the last rank of the
    group reached it), then moves its data until `end_ns`, the same on every rank."""

    kernel_id: int
    op_id: int  # the OpLaunch of the host call
    device: int
    collective: str  # "all_reduce", "all_gather", "reduce_scatter", "all_to_all", ...
    nbytes: int  # the message: bytes of the largest buffer the collective moves
    group: tuple[int, ...]  # global ranks of the group
    seq: int  # the group's call number, the same on every rank
    algorithm: str  # "ring", "tree", "pairwise", "p2p", "local"
    arrival_ns: int  # device clock
    start_ns: int
    end_ns: int
    rank: int  # this process's global rank
    host_wait_ns: int = 0  # the host's wait for the other ranks' clocks (host_alignment)

    @property
    def wait_ns(self) -> int:
        return self.start_ns - self.arrival_ns

    @property
    def transfer_ns(self) -> int:
        return self.end_ns - self.start_ns


class EventSink:
    """What a collector subscribes: the hub calls every method, and these ignore their
    event, so a sink overrides only the events it wants."""

    def op_launched(self, ev: OpLaunch) -> None:
        pass

    def kernel_scheduled(self, ev: KernelRun) -> None:
        pass

    def memory_changed(self, ev: MemoryChange) -> None:
        pass

    def sync_waited(self, ev: SyncWait) -> None:
        pass

    def compile_event(self, ev: CompileEvent) -> None:
        pass

    def collective_ran(self, ev: CollectiveRun) -> None:
        pass


_EVENTS = ("op_launched", "kernel_scheduled", "memory_changed", "sync_waited", "compile_event",
           "collective_ran")


def _ignore(ev: object) -> None:
    pass


class EventHub:
    """Fans backend events out to subscribed sinks."""

    def __init__(self) -> None:
        self.sinks: list[EventSink] = []
        self.active = False  # tested on the hot path before building any event
        self.listening_since = 0  # counts the times a first sink subscribed: one recording
        self.want_instructions = False  # build per-instruction records (engine level)
        self.want_instruction_arrays = False  # pass the kernel's schedule arrays instead

    def subscribe(self, sink: EventSink, *, instructions: bool = False,
                  instruction_arrays: bool = False) -> None:
        if not self.sinks:
            self.listening_since += 1
        self.sinks.append(sink)
        self.active = True
        self.want_instructions = self.want_instructions or instructions
        self.want_instruction_arrays = self.want_instruction_arrays or instruction_arrays
        self._bind()

    def unsubscribe(self, sink: EventSink) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)
        self.active = bool(self.sinks)
        if not self.sinks:
            self.want_instructions = False
            self.want_instruction_arrays = False
        self._bind()

    def _bind(self) -> None:
        """With a single sink (a recording), events go straight to its methods: one call
        less per event on the device's hot path. Otherwise the methods below fan out."""
        for name in _EVENTS:
            if len(self.sinks) == 1:
                # a sink written before an event existed simply ignores it
                setattr(self, name, getattr(self.sinks[0], name, _ignore))
            else:
                self.__dict__.pop(name, None)

    def op_launched(self, ev: OpLaunch) -> None:
        for s in self.sinks:
            s.op_launched(ev)

    def kernel_scheduled(self, ev: KernelRun) -> None:
        for s in self.sinks:
            s.kernel_scheduled(ev)

    def memory_changed(self, ev: MemoryChange) -> None:
        for s in self.sinks:
            s.memory_changed(ev)

    def sync_waited(self, ev: SyncWait) -> None:
        for s in self.sinks:
            s.sync_waited(ev)

    def compile_event(self, ev: CompileEvent) -> None:
        for s in self.sinks:
            s.compile_event(ev)

    def collective_ran(self, ev: CollectiveRun) -> None:
        for s in self.sinks:
            getattr(s, "collective_ran", _ignore)(ev)


hub = EventHub()
