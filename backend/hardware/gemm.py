"""Matrix multiply on the Tensor Engine: tiling, SBUF blocking, PSUM banks and DMA.

C[M, N] = A[M, K] @ B[K, N]. The contraction dim K sits on the 128 partitions; the
stationary operand (<=128 columns) becomes the output partitions and the moving
operand streams up to 512 columns per MultiplyMoving. Each output tile accumulates
over the K tiles in one of 8 PSUM banks, then the Vector Engine copies it to SBUF
(adding a bias if any) and DMA stores it. Operands are blocked so that what is kept
in SBUF fits; when even one tile row does not fit, K is streamed in chunks and the
re-reads are counted as spill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuron_explorer.backend.hardware.builder import KernelBuilder, tiles
from neuron_explorer.backend.hardware.specs import dtype_bytes

SBUF_SHARE = 0.8  # of SBUF a GEMM may use (the rest: output and bias buffers, slack)
MAX_MATMULS = 4096  # instruction pairs per kernel; beyond, consecutive ones are folded
MOVING_BUFFERS = 3
ACC_DTYPE = "float32"  # PSUM accumulates in FP32


@dataclass(frozen=True)
class Gemm:
    """One (batched) matrix multiply and where its operands live."""

    m: int
    k: int
    n: int
    dtype: str = "float32"
    out_dtype: str = "float32"
    batch: int = 1
    a_bytes: int | None = None  # HBM bytes of A per batch (default m*k*itemsize)
    b_bytes: int | None = None
    bias_bytes: int = 0  # per batch; added while copying PSUM -> SBUF
    load_a: bool = True  # False: A is already in SBUF (fused kernels)
    load_b: bool = True
    store: bool = True  # False: the result stays in SBUF for the next step


def _te_cycles(x: int, y: int, k: int) -> int:
    """Issue cycles with x on the stationary side and y moving."""
    per_y = sum(max(t, 64) for t in tiles(y, 512))
    return -(-k // 128) * -(-x // 128) * per_y


def _fold(total: int, factor: int) -> list[int]:
    """Split `total` items into runs of `factor` (each entry: items in the run)."""
    return tiles(total, max(1, factor))


def emit_gemm(b: KernelBuilder, g: Gemm, deps: Sequence[int] = ()) -> tuple[int, ...]:
    """Emit a GEMM into `b`; returns the ids of its last instructions."""
    p = b.preset
    es = dtype_bytes(g.dtype)
    oes = dtype_bytes(g.out_dtype)
    m, n, k = max(g.m, 1), max(g.n, 1), max(g.k, 1)
    b.add_model_flops(2 * g.batch * g.m * g.n * g.k)
    swap = _te_cycles(n, m, k) < _te_cycles(m, n, k)
    x_dim, y_dim = (n, m) if swap else (m, n)
    a_total = g.a_bytes if g.a_bytes is not None else m * k * es
    b_total = g.b_bytes if g.b_bytes is not None else k * n * es
    stat_total, mov_total = (b_total, a_total) if swap else (a_total, b_total)
    load_stat, load_mov = (g.load_b, g.load_a) if swap else (g.load_a, g.load_b)

    x_tiles = tiles(x_dim, p.te_cols)
    y_tiles = tiles(y_dim, p.te_moving_free_max)
    k_tiles = tiles(k, p.te_rows)
    units = g.batch * len(x_tiles) * len(y_tiles) * len(k_tiles)
    fold = -(-units // MAX_MATMULS)
    fold_k = min(fold, len(k_tiles))
    fold_b = min(g.batch, -(-fold // fold_k))
    k_runs = _fold(len(k_tiles), fold_k)  # consecutive k tiles per instruction pair

    budget = int(p.sbuf_bytes * SBUF_SHARE)
    mov_all = y_dim * k * es * fold_b
    mov_tile = k * min(y_dim, p.te_moving_free_max) * es * fold_b
    stat_tile = min(x_dim, p.te_cols) * k * es * fold_b
    mov_resident = mov_all <= budget // 2
    avail = budget - (mov_all if mov_resident else MOVING_BUFFERS * mov_tile)
    if avail < stat_tile:
        return _emit_streamed_k(b, g, swap, x_tiles, y_tiles, k_tiles, deps)
    double = avail // (2 * stat_tile) >= 2
    per_block = avail // ((2 if double else 1) * stat_tile)
    b.note_sbuf(min(per_block, len(x_tiles)) * stat_tile * (2 if double else 1)
                + (mov_all if mov_resident else MOVING_BUFFERS * mov_tile))
    b.note_psum(min(p.psum_banks, len(x_tiles) * len(y_tiles)) * p.psum_bytes // p.psum_banks)

    deps = tuple(deps)
    evacs: list[int] = []  # PSUM -> SBUF copies, one per output group (bank reuse)
    tails: list[int] = []
    for nb in _fold(g.batch, fold_b):
        bias = b.dma_load(g.bias_bytes * nb, 1, deps) if g.bias_bytes else ()
        mov_loaded: dict[int, tuple[int, ...]] = {}
        mov_users: list[int] = []  # last matmul that used each moving load, in load order
        blocks = [x_tiles[i:i + per_block] for i in range(0, len(x_tiles), per_block)]
        block_last: list[int] = []
        x0 = 0
        for bi, block in enumerate(blocks):
            slot_free = (block_last[bi - (2 if double else 1)],) if bi >= (
                2 if double else 1) else ()
            stat_ids = []
            for xt in block:
                nbytes = stat_total * xt // x_dim * nb if load_stat else 0
                stat_ids.append(b.dma_load(nbytes, xt, deps + slot_free,
                                           row_bytes=k * es) if nbytes else deps)
            last_mm = 0
            for yi, yt in enumerate(y_tiles):
                if yi in mov_loaded and mov_resident:
                    mov = mov_loaded[yi]
                else:
                    reuse = (mov_users[-MOVING_BUFFERS],) if (
                        not mov_resident and len(mov_users) >= MOVING_BUFFERS) else ()
                    nbytes = mov_total * yt // y_dim * nb if load_mov else 0
                    mov = b.dma_load(nbytes, min(k, p.partitions), deps + reuse,
                                     row_bytes=yt * es) if nbytes else deps
                    mov_loaded[yi] = mov
                    mov_users.append(-1)
                for xi, xt in enumerate(block):
                    bank = (evacs[-p.psum_banks],) if len(evacs) >= p.psum_banks else ()
                    mm = -1
                    for ki, run in enumerate(k_runs):
                        kt = k_tiles[min(ki * fold_k, len(k_tiles) - 1)]
                        first = bank if ki == 0 else ()
                        mm = b.matmul(kt, xt, yt, g.dtype, mov + stat_ids[xi] + first,
                                      weight_deps=stat_ids[xi], repeat=run * nb)
                    if g.bias_bytes:
                        ev = b.vector("TensorTensor", yt * nb, ACC_DTYPE, 2, (mm,) + bias,
                                      flops=xt * yt * nb)
                    else:
                        ev = b.vector("TensorCopy", yt * nb, ACC_DTYPE, 1, (mm,))
                    evacs.append(ev)
                    if g.store:
                        tails.extend(b.dma_store(xt * yt * oes * nb, xt, (ev,),
                                                 row_bytes=yt * oes))
                    else:
                        tails.append(ev)
                    last_mm = mm
                mov_users[-1] = last_mm
            block_last.append(last_mm)
            x0 += sum(block)
        if g.bias_bytes:
            b.add_model_flops(m * n * nb)
    return tuple(tails[-len(x_tiles) * len(y_tiles):])


def _emit_streamed_k(b: KernelBuilder, g: Gemm, swap: bool, x_tiles: list[int],
                     y_tiles: list[int], k_tiles: list[int], deps: Sequence[int]
                     ) -> tuple[int, ...]:
    """K too long for one tile row to fit in SBUF: stream both operands in K chunks per
    output tile; every read after the first of the same bytes is a spill reload."""
    p = b.preset
    es = dtype_bytes(g.dtype)
    oes = dtype_bytes(g.out_dtype)
    budget = int(p.sbuf_bytes * SBUF_SHARE)
    per_k = (p.te_cols + p.te_moving_free_max) * p.te_rows * es * 2  # double buffered
    chunk = max(1, budget // per_k)
    units = g.batch * len(x_tiles) * len(y_tiles) * -(-len(k_tiles) // chunk)
    fold_b = min(g.batch, -(-units // MAX_MATMULS))
    b.note_sbuf(min(budget, chunk * per_k))
    b.note_psum(min(p.psum_banks, len(x_tiles) * len(y_tiles)) * p.psum_bytes // p.psum_banks)
    deps = tuple(deps)
    evacs: list[int] = []
    tails: list[int] = []
    for nb in _fold(g.batch, fold_b):
        for xi, xt in enumerate(x_tiles):
            for yi, yt in enumerate(y_tiles):
                bank = (evacs[-p.psum_banks],) if len(evacs) >= p.psum_banks else ()
                mm = -1
                for c0 in range(0, len(k_tiles), chunk):
                    run = k_tiles[c0:c0 + chunk]
                    krows = sum(run)
                    stat = b.dma_load(xt * krows * es * nb, xt, deps, spill=yi > 0,
                                      row_bytes=krows * es)
                    mov = b.dma_load(krows * yt * es * nb, min(krows, 128), deps,
                                     spill=xi > 0, row_bytes=yt * es)
                    mm = b.matmul(run[0], xt, yt, g.dtype, stat + mov + (bank if c0 == 0
                                                                         else ()),
                                  weight_deps=stat, repeat=len(run) * nb)
                ev = b.vector("TensorCopy", yt * nb, ACC_DTYPE, 1, (mm,))
                evacs.append(ev)
                if g.store:
                    tails.extend(b.dma_store(xt * yt * oes * nb, xt, (ev,), row_bytes=yt * oes))
                else:
                    tails.append(ev)
    return tuple(tails[-len(x_tiles) * len(y_tiles):])
