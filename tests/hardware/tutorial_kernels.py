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
          state_size: int = 16, batch: int = 1, interleave: int = 2,
          across: str = "auto") -> Kernel:
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
    Independent iterations (`affine_range` loops) are interleaved `interleave` at a time
    in the instruction stream, so no instruction waits for the one just before it, as
    the compiler schedules them: in v1 channel tiles; in v2 and v3 channel tiles when
    their tiles fit in SBUF together, else the states of one channel tile (`across`:
    "auto", "channels" or "states"). At seq_len 8192 two channel tiles' delta, u and
    accumulator alone fill SBUF (3 x 32 KiB per partition each), and AWS's v3 profile
    there shows no spill: the compiler does not hold two tiles then.
    v2 and v3 declare their SBUF tiles as the tutorial's code names them (delta_i, u_i,
    scanC_accum, A, per state B_i, C_i, deltaA, deltaBu, scan_res, scanC; deltaU per
    seq tile; scan_init carries the scan between seq tiles), so the builder allocates
    them by live range and spills what does not fit (v2 from seq_len 5120: AWS's
    profile of v2 at 8192 shows the spill and reload queues)."""
    b = KernelBuilder(p, f"mamba_{version}")
    dt = "float32"
    tiles = channels // 128
    seq_tile = 512 if version == "v3" else seq_len
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
        for group in _channel_groups(tiles, interleave, across):
            _mamba_channel_tiles(b, dt, group, seq_len, seq_tile, state_size,
                                 interleave if across == "states" else 1)
    if across == "auto" and version != "v1":
        fits = b.live_tile_peak() <= p.sbuf_partition_bytes
        return mamba(p, version, channels, seq_len, state_size, batch, interleave,
                     "channels" if fits else "states")
    return b.build()


def _channel_groups(tiles: int, interleave: int, across: str) -> list[list[int]]:
    """The channel tiles processed together: `interleave` at a time across channels."""
    if across == "states":
        return [[t] for t in range(tiles)]
    return [list(range(t0, min(t0 + interleave, tiles))) for t0 in range(0, tiles, interleave)]


def _mamba_channel_tiles(b: KernelBuilder, dt: str, group: list[int], seq_len: int,
                         seq_tile: int, state_size: int, per_state: int) -> None:
    """v2/v3 for the channel tiles of `group`, their states `per_state` at a time."""
    row = seq_len * FP32
    full = 128 * row
    tile, touch = b.sbuf_tile, b.touch
    acc_t = {t: tile(row, name="scanC_accum") for t in group}
    delta_t = {t: tile(row, name="delta_i") for t in group}
    u_t = {t: tile(row, name="u_i") for t in group}
    a_t = {t: tile(state_size * FP32, name="A") for t in group}
    inputs = {}
    for t in group:
        loads = (b.dma_load(full, 128, row_bytes=row), b.dma_load(full, 128, row_bytes=row),
                 b.dma_load(128 * state_size * FP32, 128))
        for handle, ids in zip((delta_t[t], u_t[t], a_t[t]), loads, strict=True):
            touch(handle, ids, write=True, whole=True)
        inputs[t] = loads
    acc: dict[tuple, int] = {}
    carry: dict[tuple, int] = {}
    carry_t = {(t, s): tile(FP32, name="scan_init") for t in group for s in range(state_size)
               } if seq_tile < seq_len else {}
    for _q in range(seq_len // seq_tile):
        dus = {}
        for t in group:
            dus[t] = b.vector("TensorTensor", seq_tile, dt, 2, inputs[t][0] + inputs[t][1])
            touch(delta_t[t], (dus[t],))
            touch(u_t[t], (dus[t],))
        du_t = {t: tile(seq_tile * FP32, name="deltaU") for t in group}
        for t in group:
            touch(du_t[t], (dus[t],), write=True, whole=True)
        for s0 in range(0, state_size, per_state):
            keys = [(t, s) for t in group for s in range(s0, min(s0 + per_state, state_size))]
            _mamba_states(b, dt, seq_tile, keys, inputs, dus, du_t, delta_t, a_t, acc_t,
                          carry_t, acc, carry)
    for t in group:
        last = acc[(t,)]
        ids = b.dma_store(full, 128, (last,), row_bytes=row)
        touch(acc_t[t], ids)


def _mamba_states(b: KernelBuilder, dt: str, free: int, keys: list[tuple[int, int]],
                  inputs: dict, dus: dict, du_t: dict, delta_t: dict, a_t: dict, acc_t: dict,
                  carry_t: dict, acc: dict, carry: dict) -> None:
    """States `keys` ((channel tile, state)) of one seq tile, stage by stage."""
    tile, touch = b.sbuf_tile, b.touch
    row = free * FP32
    bc = {}
    for k in keys:
        bc[k] = b.dma_load(2 * row, 1)
        bc_t = (tile(row, 1, "B_i"), tile(row, 1, "C_i"))
        for handle in bc_t:
            touch(handle, bc[k], write=True, whole=True)
        bc[k] = (bc[k], bc_t)
    exp, dbu, scan, sc = {}, {}, {}, {}
    exp_t = {k: tile(row, name="deltaA") for k in keys}
    for t, s in keys:
        exp[(t, s)] = b.scalar("Activation", free, dt, 1, inputs[t][0] + inputs[t][2])
        touch(delta_t[t], (exp[(t, s)],))
        touch(a_t[t], (exp[(t, s)],))
        touch(exp_t[(t, s)], (exp[(t, s)],), write=True, whole=True)
    dbu_t = {k: tile(row, name="deltaBu") for k in keys}
    for t, s in keys:
        ids, (b_t, _c) = bc[(t, s)]
        dbu[(t, s)] = b.vector("TensorTensor", free, dt, 2, (dus[t],) + ids)
        touch(du_t[t], (dbu[(t, s)],))
        touch(b_t, (dbu[(t, s)],))
        touch(dbu_t[(t, s)], (dbu[(t, s)],), write=True, whole=True)
    scan_t = {k: tile(row, name="scan_res") for k in keys}
    for k in keys:
        prev = (carry[k],) if k in carry else ()
        scan[k] = b.vector("TensorTensorScan", free, dt, 2, (exp[k], dbu[k]) + prev)
        for handle in (exp_t[k], dbu_t[k]) + ((carry_t[k],) if prev else ()):
            touch(handle, (scan[k],))
        touch(scan_t[k], (scan[k],), write=True, whole=True)
        if carry_t:
            touch(carry_t[k], (scan[k],), write=True, whole=True)
            carry[k] = scan[k]
    sc_t = {k: tile(row, name="scanC") for k in keys}
    for k in keys:
        ids, (_b, c_t) = bc[k]
        sc[k] = b.vector("TensorTensor", free, dt, 2, (scan[k],) + ids)
        touch(scan_t[k], (sc[k],))
        touch(c_t, (sc[k],))
        touch(sc_t[k], (sc[k],), write=True, whole=True)
    for k in keys:
        t = k[0]
        prev = (acc[(t,)],) if (t,) in acc else ()
        acc[(t,)] = b.vector("TensorTensor", free, dt, 2, (sc[k],) + prev)
        touch(sc_t[k], (acc[(t,)],))
        if prev:  # scanC_accum += scanC: reads and writes its seq tile's columns
            touch(acc_t[t], (acc[(t,)],))
        touch(acc_t[t], (acc[(t,)],), write=True)


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
