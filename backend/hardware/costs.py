"""The timing rules of one instruction on one engine, in ns (HARDWARE.md "Timing rules").

Pure functions of the preset and the instruction's size; the builder combines them
with dependencies, in-order engines, shared DMA engines and HBM into a schedule.
"""

from __future__ import annotations

import itertools
import math

from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.presets import (
    FP8_DTYPES,
    HALF_DTYPES,
    HardwarePreset,
    te_rate_factor,
)


def matmul_ns(p: HardwarePreset, moving_free: int, dtype: str) -> float:
    """MultiplyMoving: issue interval max(N, 64) cycles; FP32 about 4x, FP8 faster."""
    cycles = max(moving_free, p.te_min_issue_cycles)
    return cycles / te_rate_factor(p, dtype) / p.te_clock_ghz


def load_stationary_ns(p: HardwarePreset, stationary_free: int, dtype: str) -> float:
    """LoadStationary: up to 4x faster than a matmul of the same size."""
    return matmul_ns(p, stationary_free, dtype) / p.te_load_speedup


def _lanes(p: HardwarePreset, dtype: str, lanes: int, lanes_16bit: int) -> int:
    if dtype in HALF_DTYPES or dtype in FP8_DTYPES:
        return lanes_16bit
    return lanes


def pipelined_ns(p: HardwarePreset, work_cycles: float, clock_ghz: float) -> float:
    """An instruction whose inputs were ready while the engine ran the previous one: its
    fixed overhead overlaps that instruction, so it costs its work, but at least the
    static instruction overhead (which limits back-to-back tiny instructions)."""
    return max(work_cycles, p.engine_fixed_cycles) / clock_ghz


def dependent_ns(p: HardwarePreset, work_cycles: float, clock_ghz: float,
                 n_inputs: int = 1) -> float:
    """An instruction that waits for its data (it depends on the instruction just before
    it, or the engine was idle): its work plus the static instruction overhead and one
    SBUF/PSUM access latency per operand (inputs + output), which back-to-back
    independent instructions hide (architecture guide, NKI performance guide)."""
    accesses = max(n_inputs, 1) + 1
    cycles = work_cycles + p.engine_fixed_cycles + p.engine_access_cycles * accesses
    return cycles / clock_ghz


def vector_cycles(p: HardwarePreset, free: int, dtype: str, n_inputs: int = 1) -> float:
    """Vector Engine work: N cycles per input operand (N = free size per partition,
    scaled by lanes beyond 128)."""
    lanes = _lanes(p, dtype, p.vector_lanes, p.vector_lanes_16bit)
    return free * max(n_inputs, 1) * p.partitions / lanes


def scalar_cycles(p: HardwarePreset, free: int, dtype: str, n_inputs: int = 1) -> float:
    """Scalar (activation) Engine work: one pass over the free size per input."""
    lanes = _lanes(p, dtype, p.scalar_lanes, p.scalar_lanes_16bit)
    return free * max(n_inputs, 1) * p.partitions / lanes


def gpsimd_cycles(p: HardwarePreset, elements: int, dtype: str,
                  cycles_per_element: float = 1.0) -> float:
    """GpSimd work: 8 general-purpose cores with 512-bit SIMD, `cycles_per_element` per
    lane."""
    lanes = p.gpsimd_cores * p.gpsimd_simd_bits // (8 * _bytes(dtype))
    return math.ceil(elements / lanes) * cycles_per_element


def vector_ns(p: HardwarePreset, free: int, dtype: str, n_inputs: int = 1) -> float:
    """A pipelined Vector Engine instruction (see `dependent_ns` for a waiting one)."""
    return pipelined_ns(p, vector_cycles(p, free, dtype, n_inputs), p.vector_clock_ghz)


def scalar_ns(p: HardwarePreset, free: int, dtype: str, n_inputs: int = 1) -> float:
    """A pipelined Scalar Engine instruction."""
    return pipelined_ns(p, scalar_cycles(p, free, dtype, n_inputs), p.scalar_clock_ghz)


def _bytes(dtype: str) -> int:
    return max(1, min(dtype_bytes(dtype), 4))


def dma_efficiency(p: HardwarePreset, bytes_per_partition: float) -> float:
    """Fraction of an engine's bandwidth a transfer reaches, from the contiguous bytes of
    each descriptor row: the preset's calibrated curve (`dma_efficiency_curve`), log-linear
    between its points, full rate from its last point on, proportional to the row size
    below its first point (overhead-bound rows)."""
    curve = p.dma_efficiency_curve
    b = float(bytes_per_partition)
    if b >= curve[-1][0]:
        return 1.0
    b0, e0 = curve[0]
    if b <= b0:
        return max(e0 * b / b0, 0.01)
    for (lo, e_lo), (hi, e_hi) in itertools.pairwise(curve):
        if b <= hi:
            t = math.log(b / lo) / math.log(hi / lo)
            return e_lo + t * (e_hi - e_lo)
    return 1.0


def dma_engine_rate(p: HardwarePreset) -> float:
    """Bytes/ns one DMA engine moves: its own rate, capped at its share of the core's HBM
    bandwidth (HBM is the shared ceiling when all engines stream; on trn2 16 x 23 B/ns
    slightly exceeds 362.5 GB/s)."""
    return min(p.dma_engine_bytes_per_ns, p.hbm_bytes_per_ns / p.dma_engines)


def dma_copy_engine_rate(p: HardwarePreset) -> float:
    """Bytes/ns one DMA engine copies HBM -> HBM: every byte is read and written, so both
    count against the core's HBM share."""
    return min(p.dma_engine_bytes_per_ns, p.hbm_bytes_per_ns / (2 * p.dma_engines))


def dma_descriptors(nbytes: int, row_bytes: float) -> int:
    """Descriptors (contiguous rows) that carry `nbytes` in rows of `row_bytes`."""
    return max(1, math.ceil(nbytes / max(row_bytes, 1.0) - 1e-9))


def dma_data_ns(p: HardwarePreset, nbytes: int, row_bytes: float,
                hbm_to_hbm: bool = False) -> float:
    """Time one DMA engine spends moving `nbytes` in contiguous rows of `row_bytes`: its
    cost per descriptor, then the bytes at its rate times the row-size efficiency."""
    if nbytes <= 0:
        return 0.0
    rate = dma_copy_engine_rate(p) if hbm_to_hbm else dma_engine_rate(p)
    return (dma_descriptors(nbytes, row_bytes) * p.dma_descriptor_ns
            + nbytes / (rate * dma_efficiency(p, row_bytes)))


def swdge_ns(p: HardwarePreset, descriptors: int) -> float:
    """GpSimd time to write `descriptors` DMA descriptors (software DGE)."""
    return descriptors * p.swdge_descriptor_cycles / p.gpsimd_clock_ghz


def throttled_ns(p: HardwarePreset, nominal_ns: float, active_ns: float) -> float:
    """Wall time of `nominal_ns` of Tensor Engine work starting after `active_ns` of
    activity, while the rate ramps linearly from `te_throttle_start` to 1 over
    `te_throttle_ramp_ns` (trn2/trn3 throttling)."""
    s = p.te_throttle_start
    ramp = p.te_throttle_ramp_ns
    if s >= 1.0 or active_ns >= ramp:
        return nominal_ns
    c = (1.0 - s) / (2.0 * ramp)

    def work(a: float) -> float:  # nominal work done after `a` ns of activity
        return s * a + c * a * a

    done = work(active_ns)
    left_in_ramp = work(ramp) - done
    if nominal_ns >= left_in_ramp:
        return (ramp - active_ns) + (nominal_ns - left_in_ramp)
    target = done + nominal_ns
    end = (-s + math.sqrt(s * s + 4.0 * c * target)) / (2.0 * c)
    return end - active_ns
