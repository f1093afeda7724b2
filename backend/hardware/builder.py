"""Build a kernel from instructions with dependencies, then list-schedule it.

Instructions are added in program order and may depend only on earlier ones. Each
engine and each DMA queue runs its own stream in order; an instruction starts when
its stream is free and its dependencies are done. Scheduling is event driven (the
stream head that can start earliest goes first), so the resources streams share
(the 16 DMA engines, the host link) are granted first come, first served in time.
A LoadStationary overlaps the matmul before it when it fits inside it. A Vector,
Scalar or GpSimd instruction that waits for its data (it depends on the one just before
it, or the engine was idle) pays the static overhead and access latency that
back-to-back independent instructions hide. Kernels are scheduled with a warm Tensor
Engine; `Kernel.te_cold_ns` is what the throttle ramp adds when the device timeline
finds the engine cold (idle for `te_throttle_idle_ns`). A DMA transfer waits for its
descriptors (the DGE block of loads or of stores, granted in time order like the
engines, or a GpSimd instruction), then for its trigger-to-first-byte latency.
A compiled graph's program puts many ops in one builder: `section` labels the
instructions of each op, `after` is what an op's first instructions wait for,
and `finished` gives the ids a later op waits on.
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from collections.abc import Iterable

import numpy as np
from neuron_explorer.backend.hardware import costs, spills
from neuron_explorer.backend.hardware.kernel import (
    DMA_QUEUES,
    FIRST_DMA,
    IO_QUEUES,
    SPILL_QUEUES,
    Kernel,
)
from neuron_explorer.common.collector_pause import collector_paused
from neuron_explorer.common.numba_available import numba_available
from neuron_explorer.common.presets import HardwarePreset

TENSOR, VECTOR, SCALAR, GPSIMD = 0, 1, 2, 3

# scheduling kinds
_PLAIN, _LOAD_STATIONARY, _MATMUL, _DMA, _HOST_DMA, _HBM_COPY = range(6)

# An indirect DMA (gather, scatter) moves a descriptor per row, this many per partition
# in one tile.
GATHER_DESCRIPTORS_PER_PARTITION = 16
# A transfer is split over the DMA engines by partitions: each engine serves 8 SBUF
# partitions (NKI DMA overview: a [128, 128] bf16 load runs on all 16 engines, 2 KiB
# each); pieces are never smaller than this (tiny transfers stay whole).
PARTITIONS_PER_DMA_ENGINE = 8
MIN_DMA_PIECE = 512
# Transfers a DMA queue keeps in flight: a transfer's latency from trigger to first byte
# runs while the earlier ones move data, so a queue of back-to-back transfers
# is bound by its engine's data rate, not by one fixed cost per transfer. Calibrated on
# AWS's measured NKI matmul tutorial (trn1): its tiled version issues one transfer per
# [128, 128] / [128, 512] tile and runs at the data rate of its 256 B-1 KiB rows
# (tests/hardware/published.py); with one transfer at a time it would take 65% longer.
DMA_QUEUE_DEPTH = 4
MAX_TRANSPOSE_RECORDS = 256  # per transpose call; more 128x128 blocks fold together
BLOCKS_PER_BANK = 4  # 128x128 transposed blocks that fill one PSUM bank (512 columns)


class DependencyBudgetExceeded(Exception):
    """A kernel's dependencies passed the `dependency_budget` its caller set."""


class KernelBuilder:
    """Collects a kernel's instructions; `build()` schedules them and returns a Kernel.

    Every add method returns the instruction id (or, for DMA, the ids of its
    transfers) to pass as `deps` to later instructions."""

    def __init__(self, preset: HardwarePreset, name: str) -> None:
        self.preset = preset
        self.name = name
        self.partitions = preset.partitions  # SBUF partitions: the lowerings' tile height
        self._engine: list[int] = []
        self._opcode: list[int] = []
        self._cost: list[float] = []  # ns; for DMA: bytes per descriptor row
        self._latency: list[float] = []  # ns a plain instruction adds when it waits for data
        self._kind: list[int] = []
        self._deps: list[tuple[int, ...]] = []
        self._dependencies = 0  # summed over `_deps`
        # Adding past this many dependencies raises DependencyBudgetExceeded: a caller that
        # would not schedule so large a kernel stops at once, not once all of it is added
        # (a padded GEMM's program spent 1.3 s adding 80 K instructions it then refused).
        self.dependency_budget: float = math.inf
        self._bytes: list[int] = []
        self._flops: list[int] = []
        self._gap: dict[int, float] = {}  # extra wait after deps (host compute in fallbacks)
        # DMA: the transfer (DMA instruction) each piece belongs to, by its first piece's
        # id, and per transfer its DGE block (0 loads, 1 stores) and generation time
        self._transfer: dict[int, int] = {}
        self._dge: dict[int, tuple[int, float, int]] = {}
        self._section: list[int] = []
        self._opcodes: dict[str, int] = {}
        self._next_queue = [0, IO_QUEUES // 2]  # next load queue, next store queue
        self._next_spill_queue = [0, SPILL_QUEUES // 2]  # next reload, next spill queue
        # SBUF tiles a kernel declares (bytes per partition, partitions, name) and their
        # accesses (tile, first and last instruction id of the access, spills.READ,
        # WRITE or WHOLE): the
        # allocation that spills what does not fit (spills.py)
        self._tiles: list[tuple[int, int, str]] = []
        self._touch_tile = array("q")
        self._touch_lo = array("q")
        self._touch_hi = array("q")
        self._touch_write = array("b")
        self._placed = False
        self.spill_origin: list[int] = []  # per spill instruction, the one it serves
        self.sbuf_tile_peak = 0  # the declared tiles' SBUF high-water, per partition
        self.model_flops = 0
        self.hbm_read_bytes = 0
        self.hbm_write_bytes = 0
        self.spill_bytes = 0
        self.sbuf_peak = 0
        self.psum_peak = 0
        # A program of several ops (a compiled graph): instructions added from now on
        # belong to section `section` of `sections`, and those added with no
        # dependencies wait for `after` (what the ops they read from compute).
        self.section = 0
        self.sections: tuple = ()
        self.host_fallbacks: list[str] = []  # ops emitted as host round trips
        self.after: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self._engine)

    # --- low level -----------------------------------------------------------------
    def add(self, engine: int, opcode: str, cost: float, deps: Iterable[int] = (),
            nbytes: int = 0, flops: int = 0, kind: int = _PLAIN, latency: float = 0.0) -> int:
        """Append one instruction; `cost` is its duration in ns (plain engines), `latency`
        what it adds when it waits for its data instead of following an independent one."""
        deps = self._checked_deps(opcode, deps, 1)
        code = self._opcode_code(opcode)
        self._engine.append(engine)
        self._opcode.append(code)
        self._cost.append(cost)
        self._latency.append(latency)
        self._kind.append(kind)
        self._deps.append(deps)
        self._dependencies += len(deps)
        self._bytes.append(int(nbytes))
        self._flops.append(int(flops))
        self._section.append(self.section)
        return len(self._engine) - 1

    def _add_pieces(self, engines: list[int], opcode: str, cost: float, deps: Iterable[int],
                    sizes: list[int], kind: int) -> range:
        """`add` for the pieces of one DMA at once (a piece per engine and size, the same
        cost, dependencies and kind): an NKI GEMM adds a million pieces."""
        n = len(engines)
        deps = self._checked_deps(opcode, deps, n)
        start = len(self._engine)
        self._engine.extend(engines)
        self._opcode.extend([self._opcode_code(opcode)] * n)
        self._cost.extend([cost] * n)
        self._latency.extend([0.0] * n)
        self._kind.extend([kind] * n)
        self._deps.extend([deps] * n)
        self._dependencies += len(deps) * n
        self._bytes.extend(sizes)
        self._flops.extend([0] * n)
        self._section.extend([self.section] * n)
        return range(start, start + n)

    def _checked_deps(self, opcode: str, deps: Iterable[int], count: int) -> tuple[int, ...]:
        """`deps` as a tuple (no dependencies: `after`), checked for `count` instructions
        that each wait for them."""
        deps = tuple(deps) or self.after
        if deps and max(deps) >= len(self._engine):
            raise ValueError(f"kernel {self.name!r}: {opcode} depends on an instruction not "
                             "yet added (dependencies must come first)")
        if self._dependencies + len(deps) * count > self.dependency_budget:
            raise DependencyBudgetExceeded(self.name)
        return deps

    def _opcode_code(self, opcode: str) -> int:
        code = self._opcodes.get(opcode)
        if code is None:
            code = self._opcodes[opcode] = len(self._opcodes)
        return code

    def dependency_count(self) -> int:
        """Dependencies between the instructions so far: the scheduling work grows with it."""
        return self._dependencies

    def finished(self, since: int, through_stores: bool = False) -> tuple[int, ...]:
        """The instructions from id `since` on that none after them depends on: once
        they are done, all of them are. `through_stores`: a DMA store counts as done
        when what it stores is (its data is in SBUF, where a later op may read it)."""
        needed: set[int] = set()
        for deps in self._deps[since:]:
            needed.update(deps)
        store = self._opcodes.get("DmaStore", -1)
        out: list[int] = []
        for i in range(since, len(self._engine)):
            if i in needed:
                continue
            if through_stores and self._opcode[i] == store and self._deps[i]:
                out.extend(self._deps[i])
            else:
                out.append(i)
        return self._last_to_end(tuple(dict.fromkeys(out)))

    def _last_to_end(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        """`ids` less those another of them cannot end before: waiting for the rest is
        waiting for all (the schedule is the same). An engine runs its instructions one
        after another, so each starts once those issued before it on that engine end,
        save a weight load hidden under a matmul (LoadStationary); a DMA queue keeps
        several in flight. A padded GEMM's op finished with 2,048 stores' evacuations and
        every instruction of the next op waited for each: 36-75 M dependencies in one
        compiled program."""
        last: dict[int, int] = {}  # engine -> the last id of `ids` issued on it, not a load
        last_load: dict[int, int] = {}  # engine -> the last weight load (they run in order)
        for i in ids:
            e = self._engine[i]
            if e >= FIRST_DMA:
                continue
            latest = last_load if self._kind[i] == _LOAD_STATIONARY else last
            if i > latest.get(e, -1):
                latest[e] = i
        if len(last) + len(last_load) == len(ids):
            return ids
        return tuple(i for i in ids if self._engine[i] >= FIRST_DMA
                     or i == last.get(self._engine[i])
                     or (i == last_load.get(self._engine[i])
                         and i > last.get(self._engine[i], -1)))

    def add_model_flops(self, flops: int) -> None:
        """FLOPs the op needs (without padding), multiply-add = 2."""
        self.model_flops += int(flops)

    def note_sbuf(self, nbytes: int) -> None:
        """Record a working set held in SBUF at one time (the kernel keeps the peak)."""
        self.sbuf_peak = max(self.sbuf_peak, int(nbytes))

    def note_psum(self, nbytes: int) -> None:
        self.psum_peak = max(self.psum_peak, int(nbytes))

    # --- SBUF tiles and spills -------------------------------------------------------
    def sbuf_tile(self, partition_bytes: int, partitions: int | None = None,
                  name: str = "") -> int:
        """Declare an SBUF tile of `partition_bytes` per partition; returns its handle for
        `touch`. A kernel that declares its tiles gets the compiler's allocation (each
        tile lives from its first access to its last) and spills when they do not fit."""
        parts = self.partitions if partitions is None else max(1, int(partitions))
        self._tiles.append((int(partition_bytes), parts, name))
        return len(self._tiles) - 1

    def touch(self, tile: int, ids: Iterable[int], write: bool = False,
              whole: bool = False) -> None:
        """Instructions `ids` (one instruction, or a transfer's pieces) read or write `tile`
        (`whole`: they overwrite all of it, so what it held before is dead: never stored
        nor reloaded). An instruction that updates a tile in place touches it twice: a
        read and a write."""
        ids = sorted(ids)
        if not ids:
            return
        code = spills.WHOLE if write and whole else spills.WRITE if write else spills.READ
        start = prev = ids[0]
        for i in ids[1:] + [-1]:
            if i != prev + 1:  # one access per run of consecutive ids
                self._touch_tile.append(tile)
                self._touch_lo.append(start)
                self._touch_hi.append(prev)
                self._touch_write.append(code)
                start = i
            prev = i

    def wait_for(self, ids: Iterable[int], deps: Iterable[int]) -> None:
        """Make instructions `ids` also wait for `deps` (which may come later in issue
        order: the stores and reloads the SBUF allocation adds)."""
        deps = tuple(deps)
        if deps:
            for i in ids:
                merged = tuple(dict.fromkeys(self._deps[i] + deps))
                self._dependencies += len(merged) - len(self._deps[i])
                self._deps[i] = merged

    def spill_transfer(self, nbytes: int, partitions: int, deps: Iterable[int],
                       store: bool) -> tuple[int, ...]:
        """A spill store (SBUF -> HBM) or a reload (HBM -> SBUF) on the spill queues."""
        self.spill_bytes += int(nbytes)
        if store:
            self.hbm_write_bytes += int(nbytes)
        else:
            self.hbm_read_bytes += int(nbytes)
        return self._dma("DmaSpill" if store else "DmaReload", nbytes, partitions, deps,
                         _DMA, store=store, spill_queue=True)

    def live_tile_peak(self) -> int:
        """The declared tiles' bytes per partition live at once at most (each from its
        first access to its last), before any spill: over the preset's SBUF, they spill."""
        return spills.Accesses(self).live_peak()

    def place_tiles(self) -> list[int]:
        """Allocate the declared tiles, adding spills and reloads where they do not fit
        (once; `build` does it too). Returns, per instruction added, the id of the
        instruction it serves."""
        if not self._placed:
            self._placed = True
            if self._tiles:
                self.spill_origin = spills.place(self)
                self.note_sbuf(self.sbuf_tile_peak * self.partitions)
        return self.spill_origin

    # --- DMA -----------------------------------------------------------------------
    def gather_rows_per_tile(self) -> int:
        """Rows an indirect (gather/scatter) DMA moves per tile: a descriptor per row,
        `GATHER_DESCRIPTORS_PER_PARTITION` of them on each partition."""
        return self.partitions * GATHER_DESCRIPTORS_PER_PARTITION

    def _dma(self, opcode: str, nbytes: int, partitions: int | None, deps: Iterable[int],
             kind: int, row_bytes: float | None = None, store: bool = False,
             pieces: int | None = None, transfers: int = 1,
             software_dge: bool = False, spill_queue: bool = False) -> tuple[int, ...]:
        """One DMA instruction (or `transfers` identical ones folded into one record): its
        descriptors are generated first (by the preset's DGE block, or by GpSimd when
        `software_dge`), then its pieces move on up to 16 engines (`spill_queue`: on the
        queues of spills and reloads)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            return ()
        p = self.preset
        partitions = p.partitions if partitions is None else max(1, min(int(partitions),
                                                                         p.partitions))
        if row_bytes is None:  # one descriptor row per partition
            row_bytes = nbytes / partitions
        most = p.dma_engines if pieces is None else max(1, pieces)
        pieces = max(1, min(most, -(-partitions // PARTITIONS_PER_DMA_ENGINE),
                            nbytes // MIN_DMA_PIECE))
        deps = tuple(deps)
        issue = p.dma_issue_ns * max(transfers, 1)
        if software_dge:
            gen = costs.swdge_ns(p, costs.dma_descriptors(nbytes, row_bytes))
            deps = (self.add(GPSIMD, "DmaDescriptors", gen, deps),)
            issue = 0.0
        next_queue = self._spill_queue if spill_queue else self._queue
        engines = [FIRST_DMA + next_queue(store) for _ in range(pieces)]
        sizes = [nbytes * (i + 1) // pieces - nbytes * i // pieces for i in range(pieces)]
        ids = self._add_pieces(engines, opcode, row_bytes, deps, sizes, kind)
        self._transfer.update(dict.fromkeys(ids, ids[0]))
        self._dge[ids[0]] = (int(store), issue, max(transfers, 1))
        return tuple(ids)

    def _queue(self, store: bool) -> int:
        """Next queue, round robin within the load half or the store half."""
        half = IO_QUEUES // 2
        q = self._next_queue[store]
        self._next_queue[store] = (q + 1) % half + (half if store else 0)
        return q

    def _spill_queue(self, store: bool) -> int:
        """Next spill (store) or reload queue, round robin: one per DMA engine each."""
        half = SPILL_QUEUES // 2
        q = self._next_spill_queue[store]
        self._next_spill_queue[store] = (q + 1) % half + (half if store else 0)
        return IO_QUEUES + q

    def dma_load(self, nbytes: int, partitions: int | None = None, deps: Iterable[int] = (),
                 spill: bool = False, row_bytes: float | None = None,
                 pieces: int | None = None, transfers: int = 1,
                 software_dge: bool = False) -> tuple[int, ...]:
        """HBM -> SBUF; large loads are spread over up to `pieces` (default 16) DMA queues
        and engines. `spill=True` marks a reload of data that did not fit in SBUF;
        `row_bytes` is the contiguous run per descriptor (default: bytes per partition);
        `transfers` folds that many DMA instructions of the same rows into one record;
        `software_dge` has GpSimd write the descriptors."""
        if spill:
            self.spill_bytes += int(nbytes)
        self.hbm_read_bytes += max(int(nbytes), 0)
        opcode = "DmaReload" if spill else "DmaLoad"
        return self._dma(opcode, nbytes, partitions, deps, _DMA, row_bytes, pieces=pieces,
                         transfers=transfers, software_dge=software_dge)

    def dma_store(self, nbytes: int, partitions: int | None = None, deps: Iterable[int] = (),
                  spill: bool = False, row_bytes: float | None = None,
                  transfers: int = 1) -> tuple[int, ...]:
        """SBUF -> HBM (`spill=True`: an intermediate written out because SBUF was full)."""
        self.hbm_write_bytes += max(int(nbytes), 0)
        opcode = "DmaSpill" if spill else "DmaStore"
        return self._dma(opcode, nbytes, partitions, deps, _DMA, row_bytes, store=True,
                         transfers=transfers)

    def spill(self, nbytes: int, partitions: int | None = None, deps: Iterable[int] = ()
              ) -> tuple[int, ...]:
        """An intermediate that does not fit in SBUF: store it to HBM and reload it.
        Returns the reload's ids (the data is usable when they finish)."""
        out = self.dma_store(nbytes, partitions, deps, spill=True)
        return self.dma_load(nbytes, partitions, out, spill=True)

    def dma_copy(self, nbytes: int, partitions: int | None = None, deps: Iterable[int] = (),
                 row_bytes: float | None = None) -> tuple[int, ...]:
        """HBM -> HBM, no engine involved (same-dtype copies). Every byte is read and
        written, so a copy moves at half the HBM share. Contiguous data needs no
        partitions: pass `row_bytes` (its contiguous runs) and the default (all)."""
        self.hbm_read_bytes += max(int(nbytes), 0)
        self.hbm_write_bytes += max(int(nbytes), 0)
        return self._dma("DmaCopy", nbytes, partitions, deps, _HBM_COPY, row_bytes,
                         store=True)

    def host_transfer(self, opcode: str, nbytes: int, deps: Iterable[int] = (),
                      wait_ns: float = 0.0) -> int:
        """A transfer over the host link (host fallback), starting `wait_ns` after deps."""
        queue = self._queue(store=opcode == "DmaToHost")
        i = self.add(FIRST_DMA + queue, opcode, 1, deps, nbytes=max(int(nbytes), 0),
                     kind=_HOST_DMA)
        if wait_ns:
            self._gap[i] = wait_ns
        return i

    # --- Tensor Engine -------------------------------------------------------------
    def matmul(self, k: int, m: int, n: int, dtype: str, deps: Iterable[int] = (),
               weight_deps: Iterable[int] = (), repeat: int = 1) -> int:
        """LoadStationary [k<=128, m<=128] then MultiplyMoving [k, n<=512] into PSUM.

        The array runs all 128x128 cells whatever k and m are, so executed FLOPs count
        the padding. `repeat` folds that many consecutive k tiles into one instruction
        pair (same time, fewer records) for very large matmuls."""
        p = self.preset
        ls = costs.load_stationary_ns(p, m, dtype) * repeat
        self.add(TENSOR, "LoadStationary", ls, weight_deps, kind=_LOAD_STATIONARY)
        mm = costs.matmul_ns(p, n, dtype) * repeat
        hw_flops = 2 * p.te_rows * p.te_cols * n * repeat
        return self.add(TENSOR, "MultiplyMoving", mm, deps, flops=hw_flops, kind=_MATMUL)

    def transpose(self, rows: int, cols: int, dtype: str, deps: Iterable[int] = ()
                  ) -> tuple[int, ...]:
        """Transpose a [rows, cols] tile held in SBUF on the Tensor Engine: per 128x128
        block, load it as weights and multiply by the identity, then copy the result out
        of PSUM. The identity matmuls count as executed FLOPs, as on the real profiler."""
        p = self.preset
        blocks = -(-max(rows, 1) // p.te_rows) * -(-max(cols, 1) // p.te_cols)
        fold = -(-blocks // MAX_TRANSPOSE_RECORDS)
        deps = tuple(deps)
        last = -1
        pending = 0  # transposed blocks in PSUM not yet copied out
        for first in range(0, blocks, fold):
            n = min(fold, blocks - first)
            self.add(TENSOR, "LoadStationary", costs.load_stationary_ns(p, p.te_cols, dtype) * n,
                     deps, kind=_LOAD_STATIONARY)
            t = self.add(TENSOR, "Transpose", costs.matmul_ns(p, p.te_rows, dtype) * n, deps,
                         flops=2 * p.te_rows * p.te_cols * p.te_rows * n, kind=_MATMUL)
            pending += n
            # one copy empties a PSUM bank: 512 columns, i.e. four transposed blocks
            if pending >= BLOCKS_PER_BANK or first + n >= blocks:
                last = self.vector("TensorCopy", p.te_rows * pending, dtype, 1, (t,))
                pending = 0
        return (last,)

    # --- Vector, Scalar, GpSimd ----------------------------------------------------
    def _engine_op(self, engine: int, opcode: str, work_cycles: float, clock_ghz: float,
                   n_inputs: int, deps: Iterable[int], flops: int) -> int:
        p = self.preset
        pipelined = costs.pipelined_ns(p, work_cycles, clock_ghz)
        waiting = costs.dependent_ns(p, work_cycles, clock_ghz, n_inputs)
        return self.add(engine, opcode, pipelined, deps, flops=flops,
                        latency=max(waiting - pipelined, 0.0))

    def vector(self, opcode: str, free: int, dtype: str, n_inputs: int = 1,
               deps: Iterable[int] = (), flops: int = 0) -> int:
        """One Vector Engine instruction over a [partitions, free] tile."""
        p = self.preset
        return self._engine_op(VECTOR, opcode, costs.vector_cycles(p, free, dtype, n_inputs),
                               p.vector_clock_ghz, n_inputs, deps, flops)

    def scalar(self, opcode: str, free: int, dtype: str, n_inputs: int = 1,
               deps: Iterable[int] = (), flops: int = 0) -> int:
        """One Scalar (activation) Engine instruction over a [partitions, free] tile."""
        p = self.preset
        return self._engine_op(SCALAR, opcode, costs.scalar_cycles(p, free, dtype, n_inputs),
                               p.scalar_clock_ghz, n_inputs, deps, flops)

    def gpsimd(self, opcode: str, elements: int, dtype: str, deps: Iterable[int] = (),
               cycles_per_element: float = 1.0, flops: int = 0) -> int:
        """One GpSimd instruction over `elements` elements."""
        p = self.preset
        work = costs.gpsimd_cycles(p, elements, dtype, cycles_per_element)
        return self._engine_op(GPSIMD, opcode, work, p.gpsimd_clock_ghz, 1, deps, flops)

    # --- scheduling ------------------------------------------------------------------
    def build(self, fallback: bool = False) -> Kernel:
        """List-schedule the instructions and return the Kernel (times relative to 0)."""
        self.place_tiles()
        start, end, te_nominal = self._scheduled()
        n = len(start)
        s = np.rint(start).astype(np.int64)
        e = np.rint(end).astype(np.int64)
        opcodes = tuple(sorted(self._opcodes, key=self._opcodes.__getitem__))
        return Kernel(
            self.name,
            flops=sum(self._flops),
            model_flops=self.model_flops,
            hbm_read_bytes=self.hbm_read_bytes,
            hbm_write_bytes=self.hbm_write_bytes,
            spill_bytes=self.spill_bytes,
            sbuf_bytes=self.sbuf_peak,
            psum_bytes=self.psum_peak,
            opcodes=opcodes,
            engine=np.asarray(self._engine, dtype=np.int16).reshape(n),
            opcode=np.asarray(self._opcode, dtype=np.int16).reshape(n),
            start=s,
            dur=e - s,
            nbytes=np.asarray(self._bytes, dtype=np.int64).reshape(n),
            iflops=np.asarray(self._flops, dtype=np.int64).reshape(n),
            fallback=fallback,
            te_cold_ns=costs.throttled_ns(self.preset, te_nominal, 0.0) - te_nominal,
            section=np.asarray(self._section, dtype=np.int32).reshape(n)
            if self.sections else None,
            sections=self.sections,
            host_fallbacks=tuple(self.host_fallbacks),  # each one: a graph may run several
        )

    def length_with(self, deps: list[tuple[int, ...]]) -> int:
        """The kernel's length scheduled with `deps` in place of its instructions'
        dependencies (a what-if: `rotated.py`'s buffers rotated); the builder is unchanged."""
        kept, self._deps = self._deps, deps
        try:
            _start, end, _te = self._scheduled()
        finally:
            self._deps = kept
        return int(np.rint(max(end, default=0.0)))

    def _scheduled(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Each instruction's start and end, and the Tensor Engine's busy time: from the
        compiled schedule for large kernels, the same times as the Python one."""
        if len(self) >= COMPILED_SCHEDULE_MIN and numba_available():
            return self._schedule_compiled()
        with collector_paused():  # the schedule's lists hold an entry per instruction
            start, end, te_nominal = self._schedule()
        return np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64), te_nominal

    def _schedule(self) -> tuple[list[float], list[float], float]:
        """Event-driven list scheduling: repeatedly start the stream head (the next
        instruction of some engine or queue) that can start earliest. Shared resources
        (DMA engines, HBM, host link) are thus granted in time order, first come first
        served, whatever order the instructions were added in. HBM bandwidth caps each
        DMA engine at its share of it (see costs.dma_data_ns). Returns the start and end
        of each instruction and the Tensor Engine's busy time (warm, for the ramp)."""
        p = self.preset
        n = len(self._engine)
        start = [0.0] * n
        end = [0.0] * n
        engines = self._engine
        kinds = self._kind
        cost = self._cost
        latency = self._latency
        nbytes = self._bytes
        gaps = self._gap
        streams, dependents, waiting, heap = self._dependency_graph()
        n_streams = len(streams)
        head = [0] * n_streams
        ready = [0.0] * n  # when the last dependency ends (plus any host wait)
        free = [0.0] * n_streams

        dma_engine_free = [0.0] * p.dma_engines  # data phase of each DMA engine
        # A NeuronCore-v3 has two DGE blocks (NKI DGE reference): one generates the loads'
        # descriptors, the other the stores', each one instruction at a time (with one
        # for loads, the kernel-optimisation guide's v2 takes its measured 1.2 us for
        # the two loads of each matmul)
        dge_free = [0.0, 0.0]
        # transfer -> when its first and last folded instruction's descriptors are ready
        triggered: dict[int, tuple[float, float]] = {}
        transfer_of = self._transfer
        dge = self._dge
        host_free = 0.0  # the host link
        te_active = 0.0  # Tensor Engine busy time so far
        mm_start = mm_end = ls_end = 0.0  # the last MultiplyMoving / LoadStationary
        fixed = p.dma_fixed_ns
        # per DMA queue: the ends of its last DMA_QUEUE_DEPTH transfers (the queue takes
        # a new transfer when the oldest in flight is done)
        in_flight: list[list[float]] = [[] for _ in range(n_streams)]
        queue_end = [0.0] * n_streams  # the end of each queue's last transfer
        # (bytes, row bytes, kind) -> a transfer's data phase: a kernel has few distinct
        data_ns: dict[tuple[int, float, int], float] = {}
        while heap:
            s, i = heapq.heappop(heap)
            e = engines[i]
            kind = kinds[i]
            if kind == _PLAIN:
                # waiting for data (not for the engine): the overheads are exposed
                f = s + cost[i] + (latency[i] if ready[i] >= free[e] else 0.0)
            elif kind == _MATMUL:
                s = max(s, ls_end)
                d = cost[i]
                te_active += d
                f = s + d
                mm_start, mm_end = s, f
            elif kind == _LOAD_STATIONARY:
                d = cost[i]
                # hide the weight load under the previous matmul when it fits inside it
                hidden = max(ready[i], ls_end, mm_start)
                if hidden + d <= mm_end:
                    s = hidden
                else:
                    te_active += d
                f = s + d
                ls_end = f
            elif kind in (_DMA, _HBM_COPY):
                eng = (e - FIRST_DMA) % p.dma_engines
                size = nbytes[i]
                first = transfer_of.get(i, i)
                block, gen, count = dge.get(first, (0, 0.0, 1))
                trigger = triggered.get(first)
                if trigger is None:  # the transfer's first piece: generate its descriptors
                    begin = max(s, dge_free[block]) if gen else s
                    # folded instructions: the first triggers after its own descriptors,
                    # the last after all of them
                    trigger = (begin + gen / count, begin + gen)
                    if gen:
                        dge_free[block] = begin + gen
                    triggered[first] = trigger
                data = data_ns.get((size, cost[i], kind))
                if data is None:
                    data = data_ns[size, cost[i], kind] = costs.dma_data_ns(
                        p, size, cost[i], hbm_to_hbm=kind == _HBM_COPY)
                triggered_at = max(s, trigger[0])
                data_start = max(triggered_at + fixed, dma_engine_free[eng])
                f = max(data_start + data, trigger[1] + fixed + data / count)
                dma_engine_free[eng] = f
                ends = in_flight[e]
                ends.append(f)
                if len(ends) > DMA_QUEUE_DEPTH:
                    ends.pop(0)
            else:  # _HOST_DMA
                link_start = max(s + fixed, host_free)
                host_free = link_start + nbytes[i] / p.host_link_bytes_per_ns
                f = host_free
            start[i] = s
            end[i] = f
            if kind in (_DMA, _HBM_COPY):
                # the record runs from the trigger (descriptor generation comes before it)
                # or where the queue's previous transfer ends, so a queue's slices never
                # overlap (a fixed cost run under earlier transfers is not shown)
                start[i] = min(max(triggered_at, queue_end[e]), f)
                queue_end[e] = f
                ends = in_flight[e]
                free[e] = max(s, ends[0]) if len(ends) == DMA_QUEUE_DEPTH else s
            else:
                free[e] = max(free[e], f)
            # the hot loop, a pass per dependency (~20 per instruction in a GEMM): a
            # comparison is cheaper than a call of max()
            for j in dependents[i]:
                if f > ready[j]:  # noqa: PLR1730 - see above
                    ready[j] = f
                w = waiting[j] - 1
                waiting[j] = w
                if w == 0:
                    ej = engines[j]
                    if streams[ej][head[ej]] == j:
                        self._push(heap, j, ready, free, gaps)
            head[e] += 1
            if head[e] < len(streams[e]):
                j = streams[e][head[e]]
                if waiting[j] == 0:
                    self._push(heap, j, ready, free, gaps)
        if head != [len(stream) for stream in streams]:  # a dependency on a later id
            raise ValueError(f"kernel {self.name!r}: an instruction depends on a later one")
        return start, end, te_active

    def _schedule_compiled(self) -> tuple[np.ndarray, np.ndarray, float]:
        """`_schedule` compiled (schedule_compiled.py): the same times, to the last bit."""
        from neuron_explorer.backend.hardware import schedule_compiled

        p = self.preset
        n = len(self._engine)
        kind = np.asarray(self._kind, dtype=np.int64).reshape(n)
        gap = np.zeros(n)
        for i, wait in self._gap.items():
            gap[i] = wait
        dep_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, self._deps), np.int64, n), out=dep_ptr[1:])
        dep_idx = np.fromiter(itertools.chain.from_iterable(self._deps), np.int64,
                              int(dep_ptr[-1]))
        first = np.arange(n, dtype=np.int64)
        pieces = len(self._transfer)
        first[np.fromiter(self._transfer.keys(), np.int64, pieces)] = np.fromiter(
            self._transfer.values(), np.int64, pieces)
        dge_block = np.zeros(n, dtype=np.int64)
        dge_gen = np.zeros(n)
        dge_count = np.ones(n, dtype=np.int64)
        for t, (block, gen, count) in self._dge.items():
            dge_block[t], dge_gen[t], dge_count[t] = block, gen, count
        cost = np.asarray(self._cost, dtype=np.float64).reshape(n)
        nbytes = np.asarray(self._bytes, dtype=np.int64).reshape(n)
        data = _data_phases(p, kind, nbytes, cost)
        start, end, te_active, complete = schedule_compiled.schedule(
            np.asarray(self._engine, dtype=np.int64).reshape(n), kind, cost,
            np.asarray(self._latency, dtype=np.float64).reshape(n), nbytes, data, gap,
            dep_ptr, dep_idx, first, dge_block, dge_gen, dge_count, FIRST_DMA + DMA_QUEUES,
            FIRST_DMA, p.dma_engines, float(p.dma_fixed_ns), float(p.host_link_bytes_per_ns),
            DMA_QUEUE_DEPTH)
        if not complete:  # a dependency on a later id
            raise ValueError(f"kernel {self.name!r}: an instruction depends on a later one")
        return start, end, float(te_active)

    def _dependency_graph(self) -> tuple[list[list[int]], list[list[int]], list[int],
                                         list[tuple[float, int]]]:
        """The schedule's starting point: each engine's and queue's stream of instructions
        in program order, each instruction's dependents, its count of unfinished
        dependencies, and the heap of the stream heads that can start now."""
        streams: list[list[int]] = [[] for _ in range(FIRST_DMA + DMA_QUEUES)]
        for i, e in enumerate(self._engine):
            streams[e].append(i)
        waiting = [len(d) for d in self._deps]
        dependents: list[list[int]] = [[] for _ in range(len(self._engine))]
        for i, deps in enumerate(self._deps):
            for d in deps:
                dependents[d].append(i)
        heap: list[tuple[float, int]] = []
        for stream in streams:
            if stream and waiting[stream[0]] == 0:
                heapq.heappush(heap, (self._gap.get(stream[0], 0.0), stream[0]))
        return streams, dependents, waiting, heap

    def _push(self, heap: list, j: int, ready: list[float], free: list[float],
              gaps: dict[int, float]) -> None:
        """Queue instruction `j` (its stream's head, dependencies done) at its start time."""
        r = ready[j] + gaps.get(j, 0.0) if gaps else ready[j]
        f = free[self._engine[j]]
        heapq.heappush(heap, (max(f, r), j))


def _data_phases(p: HardwarePreset, kind: np.ndarray, nbytes: np.ndarray,
                 cost: np.ndarray) -> np.ndarray:
    """Each DMA piece's data phase (`costs.dma_data_ns`; 0 for other instructions),
    computed once per distinct (bytes, row bytes, kind), as the Python schedule caches it."""
    data = np.zeros(len(kind))
    dma = np.flatnonzero((kind == _DMA) | (kind == _HBM_COPY))
    if not len(dma):
        return data
    keys = (nbytes[dma], cost[dma], kind[dma])
    order = np.lexsort(keys[::-1])  # by bytes, then rows, then kind
    ordered = [key[order] for key in keys]
    new_key = np.ones(len(dma), dtype=bool)
    new_key[1:] = np.logical_or.reduce([np.diff(key) != 0 for key in ordered])
    firsts = np.flatnonzero(new_key)
    values = np.array([costs.dma_data_ns(p, size, rows, hbm_to_hbm=k == _HBM_COPY)
                       for size, rows, k in zip(*(key[firsts].tolist() for key in ordered),
                                                strict=True)])
    data[dma[order]] = values[np.cumsum(new_key) - 1]
    return data


# Instructions from which the compiled schedule is worth its start-up (importing numba
# and loading its cached code: 0.5 s of CPU once per process); the Python schedule takes
# about 6 us an instruction, the compiled one 1.4 (with its arrays' set-up).
COMPILED_SCHEDULE_MIN = 100_000


def tiles(total: int, size: int) -> list[int]:
    """Split `total` into pieces of at most `size` (the last may be smaller)."""
    if total <= 0:
        return []
    full, rest = divmod(total, size)
    return [size] * full + ([rest] if rest else [])
