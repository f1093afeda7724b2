"""Matrix multiply on the Tensor Engine: tiling, SBUF blocking, PSUM banks and DMA.

C[M, N] = A[M, K] @ B[K, N]. The contraction dim K sits on the 128 partitions; the
stationary operand (<=128 columns) becomes the output partitions and the moving
operand streams up to 512 columns per MultiplyMoving. Each output tile accumulates
over K in one of 8 PSUM banks, then the Vector Engine copies it to SBUF (adding a
bias if any) and DMA stores it.

Blocking: the output is cut into blocks of xb x yb tiles and K into chunks of kc
tiles, so that double-buffered operand chunks (and, when K is chunked, an FP32
accumulator in SBUF) fit. The plan with the least estimated time (Tensor Engine,
DMA and Vector Engine each bound) is chosen; operands that fit stay resident.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuron_explorer.backend.hardware import costs
from neuron_explorer.backend.hardware.builder import KernelBuilder, tiles
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.presets import HardwarePreset, te_rate_factor

SBUF_SHARE = 0.8  # of SBUF a GEMM may use (the rest: output staging, bias, slack)
BATCH_LOAD_BYTES = 256 * 1024  # operand bytes per batch group's load (fixed cost amortised)
MAX_MATMULS = 4096  # instruction pairs per kernel; beyond, consecutive ones are folded
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
    evacuate: bool = True  # False: the next step reads PSUM directly (attention scores)


@dataclass(frozen=True)
class _Plan:
    xb: int  # stationary tiles per output block
    yb: int  # moving tiles per output block
    kc: int  # k tiles per chunk (all of them: no SBUF accumulation)
    mov_resident: bool  # the whole moving operand stays in SBUF


def _te_cycles(p: HardwarePreset, x: int, y: int, k: int) -> int:
    """Issue cycles with x on the stationary side and y moving."""
    per_y = sum(max(t, p.te_min_issue_cycles) for t in tiles(y, p.te_moving_free_max))
    return -(-k // p.te_rows) * -(-x // p.te_cols) * per_y


def _pow2_upto(n: int) -> list[int]:
    out = [1]
    while out[-1] * 2 < n:
        out.append(out[-1] * 2)
    if n > out[-1]:
        out.append(n)
    return out


def _plan(p: HardwarePreset, es: int, x_dim: int, y_dim: int, k: int, stat_total: int,
          mov_total: int, te_ns: float) -> _Plan:
    """Choose the blocking with the least estimated time among powers of two."""
    nx = -(-x_dim // p.te_cols)
    ny = -(-y_dim // p.te_moving_free_max)
    nk = -(-k // p.te_rows)
    budget = int(p.sbuf_bytes * SBUF_SHARE)
    bandwidth = p.memory_bytes_per_ns
    mov_resident = y_dim * k * es <= budget // 2
    add_ns = costs.vector_ns(p, p.te_moving_free_max, ACC_DTYPE, 2)
    best: tuple | None = None
    for kc in sorted(_pow2_upto(nk), reverse=True):
        krows = min(kc * p.te_rows, k)
        for xb in _pow2_upto(nx):
            stat_chunk = min(xb * p.te_cols, x_dim) * krows * es
            for yb in _pow2_upto(ny):
                mov_chunk = krows * min(yb * p.te_moving_free_max, y_dim) * es
                acc = 0 if kc >= nk else (min(xb * p.te_cols, x_dim)
                                          * min(yb * p.te_moving_free_max, y_dim) * 4)
                held_mov = y_dim * k * es if mov_resident else 2 * mov_chunk
                if 2 * stat_chunk + held_mov + acc > budget:
                    continue
                nxb, nyb = -(-nx // xb), -(-ny // yb)
                traffic = stat_total * (1 if kc >= nk else nyb) + mov_total * (
                    1 if mov_resident else nxb)
                vec_ns = (0 if kc >= nk else -(-nk // kc)) * nx * ny * add_ns
                est = max(te_ns, traffic / bandwidth, vec_ns)
                key = (round(est), traffic, -kc, nxb * nyb)
                if best is None or key < best[0]:
                    best = (key, _Plan(xb, yb, kc, mov_resident))
    if best is None:  # even single tiles do not fit: not reachable with real SBUF sizes
        return _Plan(1, 1, 1, False)
    return best[1]


def emit_gemm(b: KernelBuilder, g: Gemm, deps: Sequence[int] = ()) -> tuple[int, ...]:
    """Emit a GEMM into `b`; returns the ids of its last instructions.

    Three phases: lay the GEMM out on the Tensor Engine (`_layout`: orientation, tiles,
    blocking, folding), reserve its SBUF and PSUM (`_note_buffers`), then emit the loads,
    matmuls, PSUM evacuations and stores block by block (`_emit_blocks`)."""
    b.add_model_flops(2 * g.batch * g.m * g.n * g.k)
    lay = _layout(b.preset, g)
    _note_buffers(b, lay)
    return _emit_blocks(b, g, lay, tuple(deps))


@dataclass(frozen=True)
class _Layout:
    """How a GEMM maps onto the Tensor Engine: which operand is stationary, its tiles and
    their blocking, and how many matmuls fold into one instruction."""

    m: int
    n: int
    k: int
    es: int  # operand bytes per element
    swap: bool  # B is the stationary operand (the output is computed transposed)
    x_dim: int  # stationary (output row) extent
    y_dim: int  # moving (output column) extent
    stat_total: int  # HBM bytes of the stationary operand
    mov_total: int
    load_stat: bool
    load_mov: bool
    x_tiles: list[int]
    y_tiles: list[int]
    chunks: list[list[int]]  # k tiles accumulated together in PSUM
    plan: _Plan
    fold_k: int
    fold_y: int
    fold_x: int
    fold_b: int
    xblocks: list[list[int]]
    yblocks: list[list[int]]


def _layout(p: HardwarePreset, g: Gemm) -> _Layout:
    """Orientation (the cheaper operand stationary), tiles, the SBUF blocking and the
    matmul folding that keeps a kernel to MAX_MATMULS instructions."""
    es = dtype_bytes(g.dtype)
    m, n, k = max(g.m, 1), max(g.n, 1), max(g.k, 1)
    swap = _te_cycles(p, n, m, k) < _te_cycles(p, m, n, k)
    x_dim, y_dim = (n, m) if swap else (m, n)
    a_total = g.a_bytes if g.a_bytes is not None else m * k * es
    b_total = g.b_bytes if g.b_bytes is not None else k * n * es
    stat_total, mov_total = (b_total, a_total) if swap else (a_total, b_total)
    load_stat, load_mov = (g.load_b, g.load_a) if swap else (g.load_a, g.load_b)

    x_tiles = tiles(x_dim, p.te_cols)
    y_tiles = tiles(y_dim, p.te_moving_free_max)
    k_tiles = tiles(k, p.te_rows)
    # at the dtype's rate: planning FP8 (or FP32) at the BF16 rate picks blockings that
    # leave the Tensor Engine waiting
    te_ns = _te_cycles(p, x_dim, y_dim, k) / p.te_clock_ghz / te_rate_factor(p, g.dtype)
    plan = _plan(p, es, x_dim, y_dim, k, stat_total if load_stat else 0,
                 mov_total if load_mov else 0, te_ns)
    chunks = [k_tiles[i:i + plan.kc] for i in range(0, len(k_tiles), plan.kc)]
    units = g.batch * len(x_tiles) * len(y_tiles) * len(k_tiles)
    fold = -(-units // MAX_MATMULS)  # fold this many matmuls into one instruction pair
    fold_k = min(fold, plan.kc)
    fold_y = min(plan.yb, -(-fold // fold_k))
    fold_x = min(plan.xb, -(-fold // (fold_k * fold_y)))
    fold_b = min(g.batch, -(-fold // (fold_k * fold_y * fold_x)))
    if g.batch > 1:  # small per-batch GEMMs: one DMA per group of batch elements
        fold_b = max(fold_b, _batch_group(p, g.batch, a_total + b_total))

    xblocks = [list(range(i, min(i + plan.xb, len(x_tiles))))
               for i in range(0, len(x_tiles), plan.xb)]
    yblocks = [list(range(i, min(i + plan.yb, len(y_tiles))))
               for i in range(0, len(y_tiles), plan.yb)]
    return _Layout(m, n, k, es, swap, x_dim, y_dim, stat_total, mov_total, load_stat, load_mov,
                   x_tiles, y_tiles, chunks, plan, fold_k, fold_y, fold_x, fold_b, xblocks,
                   yblocks)


def _note_buffers(b: KernelBuilder, lay: _Layout) -> None:
    """The SBUF (double-buffered operands, an fp32 accumulator when K is chunked) and PSUM
    the GEMM holds at its peak."""
    p = b.preset
    plan, es, k, x_dim, y_dim = lay.plan, lay.es, lay.k, lay.x_dim, lay.y_dim
    chunks, x_tiles, y_tiles = lay.chunks, lay.x_tiles, lay.y_tiles
    krows = min(plan.kc * p.te_rows, k)
    b.note_sbuf(2 * min(plan.xb * p.te_cols, x_dim) * krows * es
                + (y_dim * k * es if plan.mov_resident else
                   2 * krows * min(plan.yb * p.te_moving_free_max, y_dim) * es)
                + (0 if len(chunks) == 1 else min(plan.xb * p.te_cols, x_dim)
                   * min(plan.yb * p.te_moving_free_max, y_dim) * 4))
    b.note_psum(min(p.psum_banks, len(x_tiles) * len(y_tiles)) * p.psum_bytes // p.psum_banks)


def _emit_blocks(b: KernelBuilder, g: Gemm, lay: _Layout, deps: tuple[int, ...]
                 ) -> tuple[int, ...]:
    """Loads just before first use (double-buffered), matmuls accumulating in PSUM banks,
    evacuations, one store per block row; returns the last stores (or evacuations)."""
    p = b.preset
    oes = dtype_bytes(g.out_dtype)
    m, n, k, swap, x_dim, y_dim = lay.m, lay.n, lay.k, lay.swap, lay.x_dim, lay.y_dim
    stat_total, mov_total, load_stat, load_mov = (lay.stat_total, lay.mov_total,
                                                  lay.load_stat, lay.load_mov)
    x_tiles, y_tiles, chunks, plan = lay.x_tiles, lay.y_tiles, lay.chunks, lay.plan
    fold_k, fold_y, fold_x, fold_b = lay.fold_k, lay.fold_y, lay.fold_x, lay.fold_b
    xblocks, yblocks = lay.xblocks, lay.yblocks
    evacs: list[int] = []  # PSUM -> SBUF copies, one per accumulation group (bank reuse)
    stat_users: list[int] = []  # last matmul reading each stationary load (buffer reuse)
    mov_users: list[int] = []
    tails: list[int] = []
    single = len(chunks) == 1
    for nb in tiles(g.batch, fold_b):
        bias = b.dma_load(g.bias_bytes * nb, 1, deps) if g.bias_bytes else ()
        mov_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        for xblock in xblocks:
            stat_cache: dict[tuple[int, int], tuple[int, ...]] = {}
            for yi, yblock in enumerate(yblocks):
                for c, chunk in enumerate(chunks):
                    kr = sum(chunk)
                    k_lo = c * plan.kc * p.te_rows
                    # A new generation of operand buffers waits until the generation two
                    # back (the other half of the double buffer) is no longer read.
                    stat_wait: tuple[int, ...] = ()
                    if not single or yi == 0:  # stationary kept across y blocks if K whole
                        stat_wait = (stat_users[-2],) if len(stat_users) >= 2 else ()
                        stat_users.append(-1)
                        if not single:
                            stat_cache = {}
                    mov_wait: tuple[int, ...] = ()
                    if not plan.mov_resident:
                        mov_wait = (mov_users[-2],) if len(mov_users) >= 2 else ()
                        mov_users.append(-1)
                        mov_cache = {}
                    last = -1
                    for x0 in range(0, len(xblock), fold_x):
                        xs = [x_tiles[i] for i in xblock[x0:x0 + fold_x]]
                        xt, nx = xs[0], len(xs)
                        # operands load per tile, just before first use, so the first
                        # matmul starts as soon as its own tiles arrive
                        stat = stat_cache.get((x0, c))
                        if stat is None:
                            x_lo = xblock[x0] * p.te_cols
                            nbytes = _share(stat_total, (x_lo, x_lo + sum(xs)), x_dim,
                                            (k_lo, k_lo + kr), k) * nb
                            stat = b.dma_load(nbytes, min(kr, p.partitions), deps + stat_wait
                                              ) if load_stat and nbytes else deps
                            stat_cache[(x0, c)] = stat
                        stores: list[tuple[int, int]] = []  # (copy-out, bytes) of this row
                        for y0 in range(0, len(yblock), fold_y):
                            ys = [y_tiles[j] for j in yblock[y0:y0 + fold_y]]
                            yt, ny = ys[0], len(ys)
                            mov = mov_cache.get((yblock[y0], c))
                            if mov is None:
                                y_lo = yblock[y0] * p.te_moving_free_max
                                nbytes = _share(mov_total, (y_lo, y_lo + sum(ys)), y_dim,
                                                (k_lo, k_lo + kr), k) * nb
                                mov = b.dma_load(nbytes, min(kr, p.partitions), deps + mov_wait
                                                 ) if load_mov and nbytes else deps
                                mov_cache[(yblock[y0], c)] = mov
                            bank = (evacs[-p.psum_banks],) if len(evacs) >= p.psum_banks else ()
                            mm = -1
                            for r0 in range(0, len(chunk), fold_k):
                                run = len(chunk[r0:r0 + fold_k])
                                mm = b.matmul(chunk[r0], xt, yt, g.dtype,
                                              mov + stat + (bank if r0 == 0 else ()),
                                              weight_deps=stat, repeat=run * nb * ny * nx)
                            evacs.append(_evacuate(b, g, c, len(chunks), mm, sum(xs),
                                                   sum(ys), nb, bias, oes, tails, stores))
                            last = mm
                        if stores:  # one store per block row: rows of the whole y block
                            total = sum(n for _, n in stores)
                            # a block as wide as the output's rows is one contiguous run
                            whole = not swap and len(yblock) == len(y_tiles)
                            tails.extend(b.dma_store(
                                total, sum(xs), tuple(ev for ev, _ in stores),
                                row_bytes=total / p.dma_engines if whole else None))
                    stat_users[-1] = last
                    if not plan.mov_resident:
                        mov_users[-1] = last
        if g.bias_bytes:
            b.add_model_flops(m * n * nb)
    return tuple(tails[-len(x_tiles) * len(y_tiles):])


def _batch_group(p: HardwarePreset, batch: int, operand_bytes: int) -> int:
    """Batch elements whose operands load in one transfer: enough that a load's fixed
    cost is amortised (a batched matmul's operands are one tensor in HBM, so several
    heads' tiles come in one access pattern), few enough that a double-buffered group
    fits in SBUF."""
    per = max(operand_bytes, 1)
    group = max(1, BATCH_LOAD_BYTES // per)
    fits = max(1, int(p.sbuf_bytes * SBUF_SHARE) // (2 * per))
    return max(1, min(batch, group, fits))


def _share(total: int, rows: tuple[int, int], n_rows: int, cols: tuple[int, int],
           n_cols: int) -> int:
    """Bytes of an operand of `total` bytes held by the block [rows) x [cols) of its
    n_rows x n_cols elements; exact over any grid of blocks (the shares telescope)."""
    def upto(r: int, c: int) -> int:
        return total * r * c // (n_rows * n_cols)

    (r0, r1), (c0, c1) = rows, cols
    return upto(r1, c1) - upto(r0, c1) - upto(r1, c0) + upto(r0, c0)


def _evacuate(b: KernelBuilder, g: Gemm, chunk: int, chunks: int, mm: int, xt: int, yt: int,
              nb: int, bias: tuple[int, ...], oes: int, tails: list[int],
              stores: list[tuple[int, int]]) -> int:
    """PSUM -> SBUF: copy (first chunk), accumulate (later chunks), add the bias; after
    the last chunk the tile joins `stores` (its block row is stored in one transfer)."""
    last = chunk == chunks - 1
    free = yt * nb * -(-xt // b.preset.partitions)  # folded row tiles add to the free size
    if not g.evacuate and last and not g.bias_bytes:
        tails.append(mm)
        return mm
    if chunk == 0 and not (last and g.bias_bytes):
        ev = b.vector("TensorCopy", free, ACC_DTYPE, 1, (mm,))
    else:  # partial sums of K chunks are bookkeeping, not FLOPs; a bias add is
        with_bias = last and g.bias_bytes > 0
        ev = b.vector("TensorTensor", free, ACC_DTYPE, 2, (mm,) + (bias if with_bias else ()),
                      flops=xt * yt * nb if with_bias else 0)
    if not last:
        return ev
    if g.store:
        stores.append((ev, xt * yt * oes * nb))
    else:
        tails.append(ev)
    return ev
