"""A lowered kernel: its totals and its instruction schedule, relative to kernel start.

The schedule is stored as parallel numpy arrays (compact for kernels with thousands
of instructions); per-instruction tuples are built only when `instructions()` is
called, i.e. when engine-level recording wants them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.common.trace_format import ENGINE_DMA, ENGINES

if TYPE_CHECKING:
    from collections.abc import Callable

# Queues a kernel spreads its transfers over: 4 on each of the 16 DMA engines, the first
# half for loads and the second for stores, so a store waiting for compute never holds
# up the loads queued behind it (each queue is FIFO). Then one reload and one spill
# queue on each engine, for the SBUF spills (the Neuron profiler shows them apart, as
# its SpillReload queues).
IO_QUEUES = 64
SPILL_QUEUES = 32
DMA_QUEUES = IO_QUEUES + SPILL_QUEUES
ENGINE_NAMES: tuple[str, ...] = ENGINES + tuple(f"dma.{q}" for q in range(DMA_QUEUES))
FIRST_DMA = len(ENGINES)
BUSY_KEYS = (*ENGINES, ENGINE_DMA)


class Kernel:
    """One kernel: what it costs and, per instruction, when each engine runs what."""

    __slots__ = (
        "_batched",
        "_bytes",
        "_dur",
        "_engine",
        "_flops",
        "_opcode",
        "_opcodes",
        "_section",
        "_start",
        "_whole_bf16",
        "duration_ns",
        "engine_busy_ns",
        "fallback",
        "flops",
        "hbm_bytes",
        "hbm_read_bytes",
        "hbm_write_bytes",
        "host_fallbacks",
        "model_flops",
        "name",
        "psum_bytes",
        "sbuf_bytes",
        "sections",
        "spill_bytes",
        "te_cold_ns",
    )

    def __init__(
        self,
        name: str,
        *,
        flops: int,
        model_flops: int,
        hbm_read_bytes: int,
        hbm_write_bytes: int,
        spill_bytes: int,
        sbuf_bytes: int,
        psum_bytes: int,
        opcodes: tuple[str, ...],
        engine: np.ndarray,
        opcode: np.ndarray,
        start: np.ndarray,
        dur: np.ndarray,
        nbytes: np.ndarray,
        iflops: np.ndarray,
        fallback: bool = False,
        te_cold_ns: float = 0.0,
        section: np.ndarray | None = None,
        sections: tuple = (),
        host_fallbacks: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.flops = int(flops)
        self.model_flops = int(model_flops)
        self.hbm_read_bytes = int(hbm_read_bytes)
        self.hbm_write_bytes = int(hbm_write_bytes)
        self.hbm_bytes = self.hbm_read_bytes + self.hbm_write_bytes
        self.spill_bytes = int(spill_bytes)  # HBM bytes re-read because SBUF was full
        self.sbuf_bytes = int(sbuf_bytes)
        self.psum_bytes = int(psum_bytes)
        self.fallback = fallback
        # extra time when the Tensor Engine starts this kernel cold (throttle ramp)
        self.te_cold_ns = round(te_cold_ns)
        # A compiled graph's program: per instruction, the index of the op (section)
        # it belongs to in `sections` (None: a kernel of one op).
        self.sections = sections
        self._section = section
        # ops of a compiled program that had no device lowering and ran on the host
        self.host_fallbacks = host_fallbacks
        # a compiled program with float32 matmuls: its length with the model cast whole to
        # bfloat16, or how to build that (`whole_bf16_ns`)
        self._whole_bf16: int | Callable[[], int | None] | None = None
        # an inference program: its length over BATCHED_CALLS times its requests' rows,
        # or how to build that (`batched_ns`)
        self._batched: int | Callable[[], int | None] | None = None
        for array in (engine, opcode, start, dur, nbytes, iflops) + (
                () if section is None else (section,)):
            array.flags.writeable = False  # kernels are cached and shared
        self._opcodes = opcodes
        self._engine = engine
        self._opcode = opcode
        self._start = start
        self._dur = dur
        self._bytes = nbytes
        self._flops = iflops
        end = start + dur
        self.duration_ns = int(end.max()) if len(end) else 0
        self.engine_busy_ns = _busy(engine, start, end)

    def __len__(self) -> int:
        return len(self._start)

    def whole_bf16_later(self, build: Callable[[], int | None]) -> None:
        """`build` times this program with the model cast whole to bfloat16 when a
        recording first asks (compiler/whole_model_dtype.py): only recordings pay for it."""
        self._whole_bf16 = build

    @property
    def whole_bf16_ns(self) -> int | None:
        """This program's length with the model cast whole to bfloat16; None when it has
        no float32 matmul (or is not a compiled program)."""
        if callable(self._whole_bf16):
            self._whole_bf16 = self._whole_bf16()
        return self._whole_bf16

    def batched_later(self, build: Callable[[], int | None]) -> None:
        """`build` times this program over more rows when a recording first asks
        (compiler/batched_program.py)."""
        self._batched = build

    @property
    def batched_ns(self) -> int | None:
        """This inference program's length over `BATCHED_CALLS` times its requests' rows;
        None where it was not built (a training graph, no request input, an eager op)."""
        if callable(self._batched):
            self._batched = self._batched()
        return self._batched

    def __repr__(self) -> str:
        return (
            f"Kernel({self.name!r}, {self.duration_ns} ns, {len(self)} instructions, "
            f"flops={self.flops}, hbm_bytes={self.hbm_bytes})"
        )

    def instructions(self, offset_ns: int = 0) -> list[tuple[str, str, int, int, int, int]]:
        """(engine, opcode, start_ns, dur_ns, bytes, flops) per instruction, in issue order;
        start is relative to the kernel start, plus `offset_ns` (pass the kernel's device
        start to get absolute times).

        On the tensor engine a LoadStationary may nest inside the MultiplyMoving it
        overlaps (weights load while the previous matmul runs); no other instructions
        of one engine or DMA queue overlap."""
        names = ENGINE_NAMES
        ops = self._opcodes
        starts = (self._start + offset_ns if offset_ns else self._start).tolist()
        return [
            (names[e], ops[o], s, d, b, f)
            for e, o, s, d, b, f in zip(
                self._engine.tolist(),
                self._opcode.tolist(),
                starts,
                self._dur.tolist(),
                self._bytes.tolist(),
                self._flops.tolist(),
                strict=True,
            )
        ]

    def arrays(self) -> dict[str, np.ndarray]:
        """The schedule as numpy arrays: engine (index into ENGINE_NAMES), opcode (index
        into `opcodes`), start, dur, bytes, flops; for bulk consumers."""
        return {
            "engine": self._engine,
            "opcode": self._opcode,
            "start": self._start,
            "dur": self._dur,
            "bytes": self._bytes,
            "flops": self._flops,
        }

    @property
    def section(self) -> np.ndarray | None:
        """Per instruction, its index into `sections` (None for a kernel of one op)."""
        return self._section

    @property
    def opcodes(self) -> tuple[str, ...]:
        return self._opcodes


def _union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of [start, end) intervals."""
    if len(start) == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s = start[order]
    e = np.maximum.accumulate(end[order])
    # a new run begins where the start passes every earlier end
    prev_end = np.concatenate(([s[0]], e[:-1]))
    gaps = np.maximum(s - prev_end, 0)
    return int(e[-1] - s[0] - gaps.sum())


def _busy(engine: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[str, int]:
    busy = dict.fromkeys(BUSY_KEYS, 0)
    for idx, key in enumerate(ENGINES):
        mask = engine == idx
        if mask.any():
            busy[key] = _union_ns(start[mask], end[mask])
    mask = engine >= FIRST_DMA
    if mask.any():
        busy["dma"] = _union_ns(start[mask], end[mask])
    return busy
