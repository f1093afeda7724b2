"""AWS's NKI tutorial kernels, expressed with the KernelBuilder instruction by instruction.

Each function issues the instruction stream the tutorial's kernel issues: the same
loads (shape, partitions, contiguous bytes per row), the same engine instructions in
the same dependency order, the same buffers. The NKI language itself is not read
(that is a separate feature); what a function cannot take from the source (how the
compiler interleaves independent iterations) is said in its docstring.

Kernels that repeat one step thousands of times fold `FOLD` consecutive k steps into
one record (`repeat=` on matmuls, one transfer for their loads): same bytes, same row
size, same Tensor Engine time, fewer records to schedule.
"""

from __future__ import annotations

from neuron_explorer.backend.hardware import KernelBuilder
from neuron_explorer.backend.hardware.kernel import Kernel
from neuron_explorer.common.presets import HardwarePreset

TILE_K, TILE_M, TILE_N = 128, 128, 512
BF16 = 2
FP32 = 4


def _wait(users: list[int], depth: int) -> tuple[int, ...]:
    """A buffer `depth` deep is free when the reader `depth` uses back is done."""
    return (users[-depth],) if len(users) >= depth and users[-depth] >= 0 else ()


def matmul_tutorial(p: HardwarePreset, version: str, m_size: int, k_size: int,
                    n_size: int, fold: int = 8, dtype: str = "bfloat16") -> Kernel:
    """The NKI matrix multiplication tutorial, lhsT [K, M] @ rhs [K, N] in `dtype` (bf16 in
    the NKI tutorial on trn1; fp32 in the kernel-optimisation guide on trn2, whose v2 is
    "tiled" and v3 "hoist_load"; the output is stored in the same dtype).

    version "tiled": per (m, n) output tile, per k: load a [128, 128] lhsT tile (256 B
    rows) and a [128, 512] rhs tile (1 KiB rows), one matmul into PSUM; copy out, store.
    "hoist_load": the m column of lhsT loads once per m; rhs tiles per (m, n, k).
    "block_free": m in blocks of 2 tiles, n in blocks of 2 tiles; lhsT per m block, rhs
    per (m block, n block); each rhs tile feeds two matmuls.
    Operand buffers are double buffered (a tile's load waits for the matmul that read
    the buffer two loads back); PSUM has 8 banks."""
    b = KernelBuilder(p, f"nki_matmul_{version}")
    nm, nn, nk = m_size // TILE_M, n_size // TILE_N, k_size // TILE_K
    fold = max(1, min(fold, nk))
    groups = nk // fold
    esize = FP32 if dtype == "float32" else BF16
    lhs_bytes = TILE_K * TILE_M * esize * fold
    rhs_bytes = TILE_K * TILE_N * esize * fold
    lhs_row, rhs_row = TILE_M * esize, TILE_N * esize
    b.add_model_flops(2 * m_size * n_size * k_size)
    evacs: list[int] = []
    lhs_users: list[int] = []
    rhs_users: list[int] = []

    def load(nbytes: int, row: int, users: list[int]) -> tuple[int, ...]:
        ids = b.dma_load(nbytes, 128, _wait(users, 2), row_bytes=row, transfers=fold)
        users.append(-1)
        return ids

    def accumulate(lhs: list[tuple[int, ...]], rhs: list[tuple[int, ...]]) -> None:
        bank = (evacs[-p.psum_banks],) if len(evacs) >= p.psum_banks else ()
        mm = -1
        for g in range(groups):
            mm = b.matmul(TILE_K, TILE_M, TILE_N, dtype, lhs[g] + rhs[g] + bank,
                          weight_deps=lhs[g], repeat=fold)
            bank = ()
        ev = b.vector("TensorCopy", TILE_N, "float32", 1, (mm,))
        b.dma_store(TILE_M * TILE_N * esize, 128, (ev,), row_bytes=rhs_row)
        evacs.append(ev)
        return mm

    if version == "tiled":
        for _m in range(nm):
            for _n in range(nn):
                lhs, rhs = [], []
                for _g in range(groups):
                    lhs.append(load(lhs_bytes, lhs_row, lhs_users))
                    rhs.append(load(rhs_bytes, rhs_row, rhs_users))
                mm = accumulate(lhs, rhs)
                # each k step's buffers are read by its own matmul; the folded group's
                # last matmul stands for them
                lhs_users[-groups:] = [mm] * groups
                rhs_users[-groups:] = [mm] * groups
    elif version == "hoist_load":
        for _m in range(nm):
            lhs = [b.dma_load(lhs_bytes, 128, row_bytes=lhs_row, transfers=fold)
                   for _g in range(groups)]
            for _n in range(nn):
                rhs = [load(rhs_bytes, rhs_row, rhs_users) for _g in range(groups)]
                mm = accumulate(lhs, rhs)
                rhs_users[-groups:] = [mm] * groups
    elif version == "block_free":
        bm_tiles, bn_tiles = 2, 2
        for _mb in range(nm // bm_tiles):
            lhs = [[b.dma_load(lhs_bytes, 128, row_bytes=lhs_row, transfers=fold)
                    for _g in range(groups)] for _bm in range(bm_tiles)]
            for _nb in range(nn // bn_tiles):
                rhs = [[load(rhs_bytes, rhs_row, rhs_users) for _g in range(groups)]
                       for _bn in range(bn_tiles)]
                last = -1
                for bm in range(bm_tiles):
                    for bn in range(bn_tiles):
                        last = accumulate(lhs[bm], rhs[bn])
                rhs_users[-groups * bn_tiles:] = [last] * (groups * bn_tiles)
    else:
        raise ValueError(f"unknown matmul tutorial version {version!r}")
    return b.build()


def matmul_fully_optimized(p: HardwarePreset, m_size: int, k_size: int, n_size: int,
                           blocks: tuple[int, int, int] = (16, 2, 8)) -> Kernel:
    """The tutorial's optimised version: n blocks of 2 tiles outermost, K in blocks of 8
    tiles (sequential), m blocks of 16 tiles; per K block the rhs block loads once
    ([128, 1024] tiles, 2 KiB rows) and each m block's lhsT ([128, 2048] tiles, 4 KiB
    rows); each output tile's 8 matmuls accumulate in PSUM, then the Vector Engine adds
    PSUM into an SBUF accumulator (fp32); at the end the accumulators are copied out
    and stored."""
    bm_tiles, bn_tiles, bk_tiles = blocks
    b = KernelBuilder(p, "nki_matmul_fully_optimized")
    block_m, block_n = TILE_M * bm_tiles, TILE_N * bn_tiles
    b.add_model_flops(2 * m_size * n_size * k_size)
    evacs: list[int] = []
    rhs_users: list[int] = []
    lhs_users: list[int] = []
    for _n in range(n_size // block_n):
        acc: dict[tuple[int, int, int], int] = {}
        for _k in range(k_size // (TILE_K * bk_tiles)):
            rhs = b.dma_load(TILE_K * bk_tiles * block_n * BF16, 128, _wait(rhs_users, 2),
                             row_bytes=block_n * BF16)
            rhs_users.append(-1)
            last = -1
            for m in range(m_size // block_m):
                lhs = b.dma_load(TILE_K * bk_tiles * block_m * BF16, 128, _wait(lhs_users, 2),
                                 row_bytes=block_m * BF16)
                lhs_users.append(-1)
                for bn in range(bn_tiles):
                    for bm in range(bm_tiles):
                        bank = (evacs[-p.psum_banks],) if len(evacs) >= p.psum_banks else ()
                        mm = b.matmul(TILE_K, TILE_M, TILE_N, "bfloat16", lhs + rhs + bank,
                                      weight_deps=lhs, repeat=bk_tiles)
                        prev = acc.get((m, bm, bn))
                        ev = b.vector("TensorTensor", TILE_N, "float32", 1,
                                      (mm,) + ((prev,) if prev is not None else ()))
                        acc[(m, bm, bn)] = ev
                        evacs.append(ev)
                        last = mm
                lhs_users[-1] = last
            rhs_users[-1] = last
        for m in range(m_size // block_m):
            for bm in range(bm_tiles):
                copies = tuple(b.vector("TensorCopy", TILE_N, "float32", 1, (acc[(m, bm, bn)],))
                               for bn in range(bn_tiles))
                b.dma_store(TILE_M * block_n * BF16, 128, copies, row_bytes=block_n * BF16)
    return b.build()


def mamba(p: HardwarePreset, version: str, channels: int, seq_len: int,
          state_size: int = 16, batch: int = 1, interleave: int = 2) -> Kernel:
    """The NKI fused Mamba tutorial kernels, fp32 (the tutorial's perf runs).

    Per channel tile (128 channels) and state: exp(delta * A) on the Scalar Engine;
    on the Vector Engine deltaU = delta * u, deltaBu = deltaU * B, the scan, scanC =
    scan * C and the accumulation (tensor_tensor and tensor_tensor_scan: 2N cycles each
    for fp32); B_i and C_i load as [1, seq] rows and broadcast over partitions as
    the engines read them.
    v1: states outermost, delta and u reloaded per (state, channel tile).
    v2: channel tiles outermost, delta and u loaded once per tile; deltaU does not
    depend on the state, so it is computed once per tile (loop-invariant: the v1 -> v2
    reordering cut VectorE work, not only its idle time, per the tutorial's profile).
    v3: v2 with seq_len in tiles of 512; the scan carries its last column over.
    Independent iterations (`affine_range` channel tiles) are interleaved `interleave`
    at a time in the instruction stream, so no instruction waits for the one just
    before it, as the compiler schedules them."""
    b = KernelBuilder(p, f"mamba_{version}")
    dt = "float32"
    tiles = channels // 128
    seq_tile = 512 if version == "v3" else seq_len
    n_seq = seq_len // seq_tile
    full = 128 * seq_len * FP32
    b.add_model_flops(batch * channels * seq_len * state_size * 10)
    for _batch in range(batch):
        if version == "v1":
            for _s in range(state_size):
                for t0 in range(0, tiles, interleave):
                    group = range(t0, min(t0 + interleave, tiles))
                    chains = {}
                    for t in group:
                        delta = b.dma_load(full, 128, row_bytes=seq_len * FP32)
                        u = b.dma_load(full, 128, row_bytes=seq_len * FP32)
                        a = b.dma_load(128 * FP32, 128)
                        bc = b.dma_load(2 * seq_len * FP32, 1)
                        chains[t] = (delta, u, a, bc)
                    _mamba_state(b, dt, seq_len, chains, hoisted=False)
            for _t in range(tiles):
                b.dma_store(full, 128, row_bytes=seq_len * FP32)
            continue
        for t0 in range(0, tiles, interleave):
            group = list(range(t0, min(t0 + interleave, tiles)))
            inputs = {t: (b.dma_load(full, 128, row_bytes=seq_len * FP32),
                          b.dma_load(full, 128, row_bytes=seq_len * FP32),
                          b.dma_load(128 * state_size * FP32, 128)) for t in group}
            acc: dict[int, int] = {}
            for _ in range(n_seq):
                dus = {t: b.vector("TensorTensor", seq_tile, dt, 2, inputs[t][0] + inputs[t][1])
                       for t in group}
                carry: dict[int, int] = {}
                for _s in range(state_size):
                    bc = {t: b.dma_load(2 * seq_tile * FP32, 1) for t in group}
                    chains = {t: (inputs[t][0], (dus[t],), inputs[t][2], bc[t]) for t in group}
                    ends = _mamba_state(b, dt, seq_tile, chains, hoisted=True, acc=acc,
                                        carry=carry)
                    acc.update(ends)
            stores = {t: b.dma_store(full, 128, (acc[t],), row_bytes=seq_len * FP32)
                      for t in group}
            del stores
    return b.build()


def _mamba_state(b: KernelBuilder, dt: str, free: int, chains: dict, hoisted: bool,
                 acc: dict | None = None, carry: dict | None = None) -> dict[int, int]:
    """One state's instructions for each interleaved channel tile, stage by stage."""
    acc = {} if acc is None else acc
    exp = {t: b.scalar("Activation", free, dt, 1, c[0] + c[2]) for t, c in chains.items()}
    if hoisted:
        du = {t: c[1][0] for t, c in chains.items()}
    else:
        du = {t: b.vector("TensorTensor", free, dt, 2, c[0] + c[1]) for t, c in chains.items()}
    dbu = {t: b.vector("TensorTensor", free, dt, 2, (du[t],) + c[3]) for t, c in chains.items()}
    scan = {}
    for t in chains:
        prev = (carry[t],) if carry is not None and t in carry else ()
        scan[t] = b.vector("TensorTensorScan", free, dt, 2, (exp[t], dbu[t]) + prev)
        if carry is not None:
            carry[t] = scan[t]
    sc = {t: b.vector("TensorTensor", free, dt, 2, (scan[t],) + chains[t][3]) for t in chains}
    return {t: b.vector("TensorTensor", free, dt, 2, (sc[t],) + ((acc[t],) if t in acc else ()))
            for t in chains}


def dma_load_rows(p: HardwarePreset, partitions: int, free_bytes: int,
                  software_dge: bool = False) -> Kernel:
    """One HBM -> SBUF load of a [partitions, free_bytes] tensor (NKI DMA overview; its
    examples generate descriptors on GpSimd: `software_dge`)."""
    b = KernelBuilder(p, "dma_load")
    b.dma_load(partitions * free_bytes, partitions, software_dge=software_dge)
    return b.build()


def dma_stream(p: HardwarePreset, free_bytes: int, count: int = 64,
               software_dge: bool = True) -> Kernel:
    """`count` independent [128, free_bytes] HBM -> SBUF loads back to back, the DMA
    overview's throughput sweep over bytes per partition (its examples generate
    descriptors on GpSimd)."""
    b = KernelBuilder(p, "dma_stream")
    for _ in range(count):
        b.dma_load(128 * free_bytes, 128, software_dge=software_dge)
    return b.build()


def dependent_tiny_activations(p: HardwarePreset, count: int = 16) -> Kernel:
    """Back-to-back Scalar Engine activations (identity with scale and bias tensors)
    reading one element per partition, each reading the previous one's output (NKI
    performance guide, Opt #5a)."""
    b = KernelBuilder(p, "tiny_activations")
    prev: tuple[int, ...] = ()
    for _ in range(count):
        prev = (b.scalar("Activation", 1, "float32", 2, prev),)
    return b.build()
