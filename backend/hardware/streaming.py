"""Streaming kernels: tiles of [128 partitions, F] loaded, processed by a chain of
engine steps, and stored, with triple buffering so DMA overlaps compute.

Elementwise ops, activations, reductions, normalisations and losses all lower to a
stream; they differ in the steps (which engine, how many operands) and in whether
the outputs are full-size (stored per tile) or small (stored once at the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuron_explorer.backend.hardware.builder import GPSIMD, SCALAR, VECTOR, KernelBuilder
from neuron_explorer.common.dtypes import dtype_bytes

BUFFERS = 3  # tiles in flight per operand: load, compute, store overlap
MAX_TILE_BYTES = 16 * 1024  # per partition and operand; >= 4 KiB keeps DMA at full rate
MAX_TILES = 256  # tile records per stream; longer streams fold tiles together


@dataclass(frozen=True)
class Step:
    """One instruction applied to every tile: engine, opcode, operands read, FLOPs/element."""

    engine: int
    opcode: str
    n_inputs: int = 1
    flops: float = 1.0
    cycles_per_element: float = 1.0  # GpSimd only
    free_scale: float = 1.0  # fraction of the tile's free size it touches (e.g. row stats)


def vec(opcode: str, n_inputs: int = 1, flops: float = 1.0, free_scale: float = 1.0) -> Step:
    return Step(VECTOR, opcode, n_inputs, flops, free_scale=free_scale)


def act(opcode: str = "Activation", n_inputs: int = 1, flops: float = 1.0) -> Step:
    return Step(SCALAR, opcode, n_inputs, flops)


def simd(opcode: str, cycles_per_element: float = 1.0, flops: float = 0.0) -> Step:
    return Step(GPSIMD, opcode, 1, flops, cycles_per_element)


def _share(total: int, lo: int, hi: int, whole: int) -> int:
    """Bytes of `total` that fall in elements [lo, hi) of `whole` (exact over all tiles)."""
    return total * hi // whole - total * lo // whole


def stream(
    b: KernelBuilder,
    elements: int,
    dtype: str,
    steps: Sequence[Step],
    *,
    inputs: Sequence[int] = (),
    outputs: Sequence[int] = (),
    small_inputs: Sequence[int] = (),
    small_outputs: Sequence[int] = (),
    deps: Sequence[int] = (),
    resident_inputs: int = 0,
    reload_inputs: Sequence[int] = (),
) -> tuple[int, ...]:
    """Emit a stream over `elements` elements of `dtype`.

    `inputs`/`outputs` are HBM byte totals of full-size operands, split over the
    tiles; `small_inputs` are loaded once before the first tile (biases, weights,
    indices), `small_outputs` stored once after the last (reductions, statistics).
    `resident_inputs` counts operands already in SBUF (fused kernels);
    `reload_inputs` are read a second time because a row did not fit in SBUF (spill
    reloads). Returns the ids of the last instructions, for later dependencies."""
    p = b.preset
    steps = list(steps)
    elements = max(int(elements), 1)
    parts = min(p.partitions, elements)
    per_part = -(-elements // parts)
    itemsize = dtype_bytes(dtype)
    operands = len(inputs) + len(outputs) + resident_inputs + 1
    budget = p.sbuf_partition_bytes // (2 * operands * BUFFERS)
    tile_bytes = max(512, min(MAX_TILE_BYTES, budget))
    tile_free = max(1, min(per_part, tile_bytes // itemsize))
    b.note_sbuf(parts * tile_free * itemsize * operands * BUFFERS
                + sum(small_inputs) + sum(small_outputs))
    # Very long streams: one record stands for several consecutive tiles (same time,
    # fewer instructions), so that a kernel stays a few thousand instructions long.
    tiles = -(-per_part // tile_free)
    if tiles > MAX_TILES:
        tile_free *= -(-tiles // MAX_TILES)

    pre: tuple[int, ...] = tuple(deps)
    for nbytes in small_inputs:
        pre = pre + b.dma_load(nbytes, min(parts, max(1, nbytes // 4)), deps)
    last_per_tile: list[tuple[int, ...]] = []
    lo = 0
    tail: tuple[int, ...] = pre
    while lo < per_part:
        hi = min(per_part, lo + tile_free)
        free = hi - lo
        t = len(last_per_tile)
        wait = last_per_tile[t - BUFFERS] if t >= BUFFERS else ()
        ready = tuple(deps) + wait
        loads: tuple[int, ...] = ()
        for nbytes in inputs:
            loads = loads + b.dma_load(_share(nbytes, lo, hi, per_part), parts, ready)
        for nbytes in reload_inputs:
            loads = loads + b.dma_load(_share(nbytes, lo, hi, per_part), parts, ready,
                                       spill=True)
        prev = loads + pre if loads or pre else ready
        for st in steps:
            n_el = free * parts
            f = max(1, round(free * st.free_scale))
            if st.engine == VECTOR:
                i = b.vector(st.opcode, f, dtype, st.n_inputs, prev, int(st.flops * n_el))
            elif st.engine == SCALAR:
                i = b.scalar(st.opcode, f, dtype, st.n_inputs, prev, int(st.flops * n_el))
            else:
                i = b.gpsimd(st.opcode, n_el, dtype, prev, st.cycles_per_element,
                             int(st.flops * n_el))
            prev = (i,)
        stores: tuple[int, ...] = ()
        for nbytes in outputs:
            stores = stores + b.dma_store(_share(nbytes, lo, hi, per_part), parts, prev)
        tail = stores or prev
        last_per_tile.append(tail)
        lo = hi
    b.add_model_flops(int(sum(st.flops for st in steps) * elements))
    if small_outputs:
        done: tuple[int, ...] = ()
        for nbytes in small_outputs:
            done = done + b.dma_store(nbytes, min(parts, max(1, nbytes // 4)), tail)
        return done
    return tail
