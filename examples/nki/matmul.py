"""The NKI matrix multiplication tutorial's kernels, written with neuron_explorer.nki.

result[M, N] = lhsT[K, M].T @ rhs[K, N], bf16 in, fp32 accumulation in PSUM. The
versions follow AWS's tutorial (aws-neuron-sdk, NKI tutorial 'Matrix multiplication'),
each faster than the one before at the tutorial's shape:
  tiled -> hoist_load (lhsT column loaded once per m) -> block_free (free dims blocked,
  fewer loads) -> fully_optimized (all dims blocked, large DMAs, SBUF accumulation).

    python examples/nki/matmul.py       # numerics at a small shape, then the line profile
"""

from __future__ import annotations

import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import numpy as np
from neuron_explorer import nki


@nki.jit
def matmul_basic(lhsT, rhs):
    """One [64, 128] x [128, 512] product: load, one matmul into PSUM, copy out, store."""
    _, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    lhs_tile = nl.ndarray(lhsT.shape, dtype=lhsT.dtype, buffer=nl.sbuf)
    rhs_tile = nl.ndarray(rhs.shape, dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=lhs_tile, src=lhsT)
    nisa.dma_copy(dst=rhs_tile, src=rhs)
    result_psum = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(result_psum, lhs_tile, rhs_tile)
    result_sbuf = nl.ndarray((M, N), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result_sbuf, src=result_psum, dtype=result.dtype)
    nisa.dma_copy(dst=result, src=result_sbuf)
    return result


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Per output tile [128, 512]: per k, load a lhsT and a rhs tile, accumulate."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_K = nl.tile_size.pmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile,
                              src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                nisa.dma_copy(dst=rhs_tile,
                              src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile)
            res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum, dtype=result.dtype)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N],
                          src=res_sb)
    return result


@nki.jit
def matmul_tiled_language(lhsT, rhs):
    """The tiled kernel in the nl API of the earlier tutorial: nl.load, nl.matmul
    accumulated with +=, nl.copy out of PSUM, nl.store."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M, TILE_K, TILE_N = 128, 128, 512
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N],
                     value=res_sb)
    return result


@nki.jit
def matmul_hoist_load(lhsT, rhs):
    """Optimisation 1: the lhsT column of tiles loads once per m, not once per (m, n)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M, TILE_K, TILE_N = 128, 128, 512
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        lhsT_tiles = []
        for k in nl.affine_range(K // TILE_K):
            lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=lhsT_tile,
                          src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
            lhsT_tiles.append(lhsT_tile)
        for n in nl.affine_range(N // TILE_N):
            rhs_tiles = []
            for k in nl.affine_range(K // TILE_K):
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=rhs_tile,
                              src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                rhs_tiles.append(rhs_tile)
            res_psum = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tiles[k], moving=rhs_tiles[k])
            res_sb = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum, dtype=result.dtype)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N],
                          src=res_sb)
    return result


@nki.jit
def matmul_block_free(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2):
    """Optimisation 2: M and N in blocks of tiles; each loaded tile feeds several
    matmuls, so fewer bytes move per FLOP."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M, TILE_K, TILE_N = 128, 128, 512
    BLOCK_M, BLOCK_N = TILE_M * TILES_IN_BLOCK_M, TILE_N * TILES_IN_BLOCK_N
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // BLOCK_M):
        lhsT_tiles = []
        for bm in nl.affine_range(TILES_IN_BLOCK_M):
            row = []
            for k in nl.affine_range(K // TILE_K):
                tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                col = (m * TILES_IN_BLOCK_M + bm) * TILE_M
                nisa.dma_copy(dst=tile, src=lhsT[k * TILE_K:(k + 1) * TILE_K, col:col + TILE_M])
                row.append(tile)
            lhsT_tiles.append(row)
        for n in nl.affine_range(N // BLOCK_N):
            rhs_tiles = []
            for bn in nl.affine_range(TILES_IN_BLOCK_N):
                row = []
                for k in nl.affine_range(K // TILE_K):
                    tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                    col = (n * TILES_IN_BLOCK_N + bn) * TILE_N
                    nisa.dma_copy(dst=tile, src=rhs[k * TILE_K:(k + 1) * TILE_K, col:col + TILE_N])
                    row.append(tile)
                rhs_tiles.append(row)
            for bm in nl.affine_range(TILES_IN_BLOCK_M):
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    res_psum = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TILE_K):
                        nisa.nc_matmul(dst=res_psum, stationary=lhsT_tiles[bm][k],
                                       moving=rhs_tiles[bn][k])
                    res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res_sb, src=res_psum)
                    r0 = (m * TILES_IN_BLOCK_M + bm) * TILE_M
                    c0 = (n * TILES_IN_BLOCK_N + bn) * TILE_N
                    nisa.dma_copy(dst=result[r0:r0 + TILE_M, c0:c0 + TILE_N], src=res_sb)
    return result


@nki.jit
def matmul_fully_optimized(lhsT, rhs, TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2,
                           TILES_IN_BLOCK_K=8):
    """Optimisation 3: every dimension blocked. Per K block the rhs block loads once as
    [128, BLOCK_N] tiles and each M block's lhsT as [128, BLOCK_M] tiles (long
    contiguous rows: efficient DMA); PSUM partial sums are added into SBUF
    accumulators; a block row of results is packed and stored in one transfer."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M, TILE_K, TILE_N = 128, 128, 512
    BLOCK_M = TILE_M * TILES_IN_BLOCK_M
    BLOCK_N = TILE_N * TILES_IN_BLOCK_N
    BLOCK_K = TILE_K * TILES_IN_BLOCK_K
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(N // BLOCK_N):
        # accumulators in the input dtype, as the tutorial (fp32 would not fit twice in
        # SBUF while the next n block's accumulators are created)
        acc = [[[nl.zeros((TILE_M, TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf)
                 for _bn in range(TILES_IN_BLOCK_N)]
                for _bm in range(TILES_IN_BLOCK_M)]
               for _m in range(M // BLOCK_M)]
        for k in nl.sequential_range(K // BLOCK_K):
            rhs_tiles = []
            for bk in range(TILES_IN_BLOCK_K):
                tile = nl.ndarray((TILE_K, BLOCK_N), dtype=rhs.dtype, buffer=nl.sbuf)
                k0 = (TILES_IN_BLOCK_K * k + bk) * TILE_K
                nisa.dma_copy(dst=tile, src=rhs[k0:k0 + TILE_K, BLOCK_N * n:BLOCK_N * (n + 1)])
                rhs_tiles.append(tile)
            for m in nl.affine_range(M // BLOCK_M):
                lhsT_tiles = []
                for bk in nl.affine_range(TILES_IN_BLOCK_K):
                    tile = nl.ndarray((TILE_K, BLOCK_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                    k0 = (TILES_IN_BLOCK_K * k + bk) * TILE_K
                    nisa.dma_copy(dst=tile,
                                  src=lhsT[k0:k0 + TILE_K, BLOCK_M * m:BLOCK_M * (m + 1)])
                    lhsT_tiles.append(tile)
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    for bm in nl.affine_range(TILES_IN_BLOCK_M):
                        res_psum = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(TILES_IN_BLOCK_K):
                            nisa.nc_matmul(
                                dst=res_psum,
                                stationary=lhsT_tiles[bk][:, bm * TILE_M:(bm + 1) * TILE_M],
                                moving=rhs_tiles[bk][:, bn * TILE_N:(bn + 1) * TILE_N])
                        nisa.tensor_tensor(dst=acc[m][bm][bn], data1=acc[m][bm][bn],
                                           data2=res_psum, op=nl.add)
        for m in nl.affine_range(M // BLOCK_M):
            for bm in nl.affine_range(TILES_IN_BLOCK_M):
                packed = nl.ndarray((TILE_M, BLOCK_N), dtype=result.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(TILES_IN_BLOCK_N):
                    nisa.tensor_copy(dst=packed[:, bn * TILE_N:(bn + 1) * TILE_N],
                                     src=acc[m][bm][bn])
                r0 = (TILES_IN_BLOCK_M * m + bm) * TILE_M
                nisa.dma_copy(dst=result[r0:r0 + TILE_M, BLOCK_N * n:BLOCK_N * (n + 1)],
                              src=packed)
    return result


VERSIONS = {"tiled": matmul_tiled, "hoist_load": matmul_hoist_load,
            "block_free": matmul_block_free, "fully_optimized": matmul_fully_optimized}


def main() -> None:
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((256, 256), dtype=np.float32)
    rhs = rng.standard_normal((256, 1024), dtype=np.float32)
    expected = lhsT.T @ rhs
    for name, kernel in VERSIONS.items():
        kw = {"TILES_IN_BLOCK_M": 2, "TILES_IN_BLOCK_K": 2} if name == "fully_optimized" else {}
        out = nki.simulate_kernel(kernel, lhsT, rhs, **kw)
        print(f"{name:>16}: max error {np.abs(out - expected).max():.2e}")
    bench = nki.benchmark(matmul_fully_optimized, lhsT, rhs, TILES_IN_BLOCK_M=2,
                          TILES_IN_BLOCK_K=2)
    print(bench.table())


if __name__ == "__main__":
    main()
