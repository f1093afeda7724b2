"""The list schedule of `KernelBuilder._schedule`, compiled with numba for large kernels.

The Python schedule costs about 6 us per instruction: 7 s of a 1.1 M-instruction GEMM
(the kernel-optimisation guide's tiled version at its measured shape), most of a large
compiled graph's what-if replay. This one takes the same steps over arrays in machine
code, in the same order and with the same floating-point operations, so it gives the
same start and end times to the last bit (`tests/hardware/test_scheduling.py` checks it
on kernels of every scheduling kind).

What the Python schedule looks up per instruction comes in as arrays: each DMA piece's
data phase (`costs.dma_data_ns`, computed in Python once per distinct transfer), its
transfer's first piece and descriptor generation (DGE block, time, folded count), each
instruction's extra wait (`gap`) and its dependencies (CSR: `dep_ptr`, `dep_idx`).

Compiled code is cached on disk by numba (`cache=True`): the first use on a machine pays
the compilation (seconds), later processes load it.
"""

from __future__ import annotations

import heapq

import numba
import numpy as np

# scheduling kinds, as builder.py numbers them: written here, not imported, because
# numba's disk cache is checked against this file only (the compiled-against-Python
# test fails where the two differ); the first DMA stream comes in as an argument
_PLAIN, _LOAD_STATIONARY, _MATMUL, _DMA, _HOST_DMA, _HBM_COPY = range(6)

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)


@_jit
def _csr(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..len(keys)-1 grouped by key, each group in ascending order."""
    ptr = np.zeros(n_keys + 1, np.int64)
    for k in keys:
        ptr[k + 1] += 1
    for k in range(n_keys):
        ptr[k + 1] += ptr[k]
    fill = ptr[:-1].copy()
    out = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        k = keys[i]
        out[fill[k]] = i
        fill[k] += 1
    return ptr, out


@_jit
def schedule(engine: np.ndarray, kind: np.ndarray, cost: np.ndarray, latency: np.ndarray,
             nbytes: np.ndarray, data: np.ndarray, gap: np.ndarray, dep_ptr: np.ndarray,
             dep_idx: np.ndarray, first: np.ndarray, dge_block: np.ndarray,
             dge_gen: np.ndarray, dge_count: np.ndarray, n_streams: int, first_dma: int,
             dma_engines: int, dma_fixed: float, host_rate: float, queue_depth: int
             ) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """(start, end, Tensor Engine busy time, whether every instruction was scheduled)."""
    n = len(engine)
    start = np.zeros(n, np.float64)
    end = np.zeros(n, np.float64)
    stream_ptr, stream = _csr(engine.astype(np.int64), n_streams)
    # each instruction's dependents, in the order the Python schedule appends them: by
    # dependent id, a dependency listed twice counted twice
    dep_of = np.empty(len(dep_idx), np.int64)
    for i in range(n):
        for k in range(dep_ptr[i], dep_ptr[i + 1]):
            dep_of[k] = i
    by_dep_ptr, by_dep = _csr(dep_idx, n)
    dependents = dep_of[by_dep]
    waiting = dep_ptr[1:] - dep_ptr[:-1]
    head = np.zeros(n_streams, np.int64)
    ready = np.zeros(n, np.float64)
    free = np.zeros(n_streams, np.float64)
    dma_engine_free = np.zeros(dma_engines, np.float64)
    dge_free = np.zeros(2, np.float64)
    trigger_first = np.zeros(n, np.float64)  # by a transfer's first piece
    trigger_last = np.zeros(n, np.float64)
    triggered = np.zeros(n, np.bool_)
    ring = np.zeros((n_streams, queue_depth), np.float64)  # a queue's last ends
    in_flight = np.zeros(n_streams, np.int64)  # transfers a queue has taken so far
    queue_end = np.zeros(n_streams, np.float64)
    host_free = 0.0
    te_active = 0.0
    mm_start = 0.0
    mm_end = 0.0
    ls_end = 0.0
    heap = [(0.0, np.int64(0))]
    heap.pop()
    for e in range(n_streams):
        if stream_ptr[e] < stream_ptr[e + 1]:
            j = stream[stream_ptr[e]]
            if waiting[j] == 0:
                heapq.heappush(heap, (gap[j], j))
    while len(heap):
        s, i = heapq.heappop(heap)
        e = engine[i]
        k = kind[i]
        triggered_at = 0.0
        if k == _PLAIN:
            f = s + cost[i] + (latency[i] if ready[i] >= free[e] else 0.0)
        elif k == _MATMUL:
            s = max(s, ls_end)
            d = cost[i]
            te_active += d
            f = s + d
            mm_start, mm_end = s, f
        elif k == _LOAD_STATIONARY:
            d = cost[i]
            hidden = max(max(ready[i], ls_end), mm_start)
            if hidden + d <= mm_end:
                s = hidden
            else:
                te_active += d
            f = s + d
            ls_end = f
        elif k in (_DMA, _HBM_COPY):
            eng = (e - first_dma) % dma_engines
            t = first[i]
            count = dge_count[t]
            gen = dge_gen[t]
            if not triggered[t]:  # the transfer's first piece: generate its descriptors
                block = dge_block[t]
                begin = max(s, dge_free[block]) if gen != 0.0 else s
                trigger_first[t] = begin + gen / count
                trigger_last[t] = begin + gen
                triggered[t] = True
                if gen != 0.0:
                    dge_free[block] = begin + gen
            triggered_at = max(s, trigger_first[t])
            data_start = max(triggered_at + dma_fixed, dma_engine_free[eng])
            f = max(data_start + data[i], trigger_last[t] + dma_fixed + data[i] / count)
            dma_engine_free[eng] = f
            ring[e, in_flight[e] % queue_depth] = f
            in_flight[e] += 1
        else:  # _HOST_DMA
            link_start = max(s + dma_fixed, host_free)
            host_free = link_start + nbytes[i] / host_rate
            f = host_free
        start[i] = s
        end[i] = f
        if k in (_DMA, _HBM_COPY):
            start[i] = min(max(triggered_at, queue_end[e]), f)
            queue_end[e] = f
            if in_flight[e] >= queue_depth:  # the oldest of the last `queue_depth`
                free[e] = max(s, ring[e, in_flight[e] % queue_depth])
            else:
                free[e] = s
        else:
            free[e] = max(free[e], f)
        for m in range(by_dep_ptr[i], by_dep_ptr[i + 1]):
            j = dependents[m]
            ready[j] = max(ready[j], f)
            waiting[j] -= 1
            if waiting[j] == 0:
                ej = engine[j]
                if stream[stream_ptr[ej] + head[ej]] == j:
                    heapq.heappush(heap, (max(free[ej], ready[j] + gap[j]), j))
        head[e] += 1
        if stream_ptr[e] + head[e] < stream_ptr[e + 1]:
            j = stream[stream_ptr[e] + head[e]]
            if waiting[j] == 0:
                heapq.heappush(heap, (max(free[e], ready[j] + gap[j]), j))
    complete = True
    for e in range(n_streams):
        if head[e] != stream_ptr[e + 1] - stream_ptr[e]:
            complete = False
    return start, end, te_active, complete
