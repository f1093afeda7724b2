"""The cost model against closed forms from the published figures and timing rules."""

from __future__ import annotations

import pytest
from neuron_explorer.backend.hardware import OpSpec, TensorSpec, costs, get_preset, lower_op

T = TensorSpec


def mm(m: int, k: int, n: int, dtype: str = "bfloat16") -> OpSpec:
    return OpSpec("aten::mm", (T((m, k), dtype), T((k, n), dtype)), (T((m, n), dtype),))


def add(shape: tuple[int, ...], dtype: str = "float32") -> OpSpec:
    return OpSpec("aten::add", (T(shape, dtype), T(shape, dtype)), (T(shape, dtype),))


def tensor_utilisation(kernel, preset, dtype="bfloat16") -> float:
    """Model FLOPs over what the Tensor Engine could do in the kernel's whole duration."""
    return kernel.model_flops / (preset.te_peak_flops(dtype) * kernel.duration_ns * 1e-9)


@pytest.fixture(scope="module")
def trn2():
    return get_preset("trn2")


@pytest.fixture(scope="module")
def big_bf16(trn2):
    return lower_op(mm(4096, 4096, 4096), trn2)


def test_large_bf16_matmul_reaches_tensor_engine_peak(trn2, big_bf16):
    util = tensor_utilisation(big_bf16, trn2)
    assert 0.85 <= util <= 1.0
    # the DMA is overlapped: it is busy for a good part of the kernel (stores go out a
    # block row at a time, in wide rows), yet the kernel is no longer than the Tensor
    # Engine's own work plus a short prologue and epilogue
    assert big_bf16.engine_busy_ns["dma"] > 0.3 * big_bf16.duration_ns
    assert big_bf16.duration_ns < 1.1 * big_bf16.engine_busy_ns["tensor"]


def test_fp32_matmul_is_about_four_times_slower(trn2, big_bf16):
    fp32 = lower_op(mm(4096, 4096, 4096, "float32"), trn2)
    ratio = fp32.duration_ns / big_bf16.duration_ns
    assert 3.5 <= ratio <= 4.3
    assert tensor_utilisation(fp32, trn2, "float32") > 0.85


def test_large_elementwise_add_is_bound_by_hbm_bandwidth(trn2):
    spec = add((4096, 4096))
    kernel = lower_op(spec, trn2)
    moved = 3 * 4096 * 4096 * 4
    assert kernel.hbm_bytes == moved
    bound_ns = moved / trn2.hbm_bytes_per_ns
    assert bound_ns <= kernel.duration_ns <= 1.15 * bound_ns
    assert kernel.engine_busy_ns["vector"] < 0.5 * kernel.duration_ns  # not compute-bound


def test_contraction_not_a_multiple_of_128_wastes_array_rows(trn2):
    full = lower_op(mm(2048, 128, 2048), trn2)
    short = lower_op(mm(2048, 127, 2048), trn2)
    over = lower_op(mm(2048, 129, 2048), trn2)
    # 127 rows: the array still runs 128 rows, so executed FLOPs and time stay, the
    # model FLOPs drop: hardware FLOPs exceed model FLOPs by 128/127
    assert short.flops == full.flops
    assert short.model_flops / short.flops == pytest.approx(127 / 128)
    assert short.engine_busy_ns["tensor"] == pytest.approx(full.engine_busy_ns["tensor"],
                                                          rel=0.02)
    # 129 rows: a second, almost empty row of tiles doubles the Tensor Engine's work
    assert over.flops == 2 * full.flops
    assert over.model_flops / over.flops == pytest.approx(129 / 256)
    te_ratio = over.engine_busy_ns["tensor"] / full.engine_busy_ns["tensor"]
    assert 1.8 <= te_ratio <= 2.1


def test_generations_differ_as_their_figures_say():
    trn1, trn2, trn3 = (get_preset(n) for n in ("trn1", "trn2", "trn3"))
    big = mm(2048, 2048, 2048)
    te = {p.name: lower_op(big, p).engine_busy_ns["tensor"] for p in (trn1, trn2, trn3)}
    # trn1's array clocks at 2.8 GHz, trn2/trn3 at 2.4 GHz (trn2/trn3 also ramp up)
    assert te["trn2"] / te["trn1"] == pytest.approx(2.8 / 2.4, rel=0.03)
    assert te["trn3"] == pytest.approx(te["trn2"], rel=0.01)
    stream = add((2048, 4096))
    t = {p.name: lower_op(stream, p).duration_ns for p in (trn1, trn2, trn3)}
    # streaming is bound by min(HBM, DMA) bandwidth: 272 (DMA), 362.5 (HBM), 528 (DMA) GB/s
    assert t["trn1"] / t["trn2"] == pytest.approx(362.5 / 272, rel=0.1)
    assert t["trn3"] / t["trn2"] == pytest.approx(362.5 / 528, rel=0.1)
    # FP8 doubles trn2's Tensor Engine rate and quadruples trn3's
    fp8 = mm(2048, 2048, 2048, "float8_e4m3fn")
    assert te["trn2"] / lower_op(fp8, trn2).engine_busy_ns["tensor"] == pytest.approx(2, rel=0.1)
    assert te["trn3"] / lower_op(fp8, trn3).engine_busy_ns["tensor"] == pytest.approx(4, rel=0.2)


def test_small_dma_transfers_are_overhead_bound(trn2):
    tiny = lower_op(add((4, 4)), trn2)
    # a load then a store, each waiting for its descriptors (600 ns of hardware DGE) and
    # ~1.1 us from trigger to first byte: the 192 bytes are noise
    assert tiny.duration_ns >= 2 * (trn2.dma_issue_ns + trn2.dma_fixed_ns)
    assert tiny.hbm_bytes / tiny.duration_ns < 0.01 * trn2.hbm_bytes_per_ns
    # a single transfer's rows move at the engine's rate from 256 B on (the DMA overview's
    # 97 ns for 8 x 256 B); shorter rows are overhead-bound, in proportion
    assert costs.dma_efficiency(trn2, 256) == 1.0 == costs.dma_efficiency(trn2, 65536)
    assert costs.dma_efficiency(trn2, 64) == pytest.approx(0.25)
    rate = min(trn2.dma_engine_bytes_per_ns, trn2.hbm_bytes_per_ns / trn2.dma_engines)
    assert costs.dma_data_ns(trn2, 2048, 256) == pytest.approx(8 * 1.0 + 2048 / rate)


def test_back_to_back_small_transfers_are_bound_by_descriptor_generation(trn2):
    """Small transfers lose throughput to each DMA instruction's descriptor generation,
    which overlaps the earlier transfers' data: N loads of [128, F] take N x max(DGE
    time, one engine's data phase), plus one start."""
    from neuron_explorer.backend.hardware import KernelBuilder

    def stream(free, n, software_dge=False):
        b = KernelBuilder(trn2, "stream")
        for _ in range(n):
            b.dma_load(128 * free, 128, software_dge=software_dge)
        return b.build().duration_ns

    for free in (256, 1024, 4096):
        data = costs.dma_data_ns(trn2, 8 * free, free)  # one engine's 8 rows
        per_transfer = stream(free, 64) - stream(free, 32)
        assert per_transfer == pytest.approx(32 * max(trn2.dma_issue_ns, data), rel=0.02)
        # software DGE: GpSimd writes 128 descriptors per transfer
        gen = costs.swdge_ns(trn2, 128)
        assert gen == pytest.approx(128 * 8 / 1.2)
        per_transfer = stream(free, 64, True) - stream(free, 32, True)
        assert per_transfer == pytest.approx(32 * max(gen, data), rel=0.02)


def test_throttle_ramp_closed_form(trn2):
    ramp = trn2.te_throttle_ramp_ns
    # from cold, the rate starts at 50%: a tiny piece of work takes twice as long
    assert costs.throttled_ns(trn2, 1.0, 0.0) == pytest.approx(2.0, rel=1e-3)
    # over the ramp, nominal work done = 0.5*R + 0.25*R = 0.75*R
    assert costs.throttled_ns(trn2, 0.75 * ramp, 0.0) == pytest.approx(ramp)
    # long work loses R/4 in total; after the ramp the rate is full
    assert costs.throttled_ns(trn2, 1e6, 0.0) == pytest.approx(1e6 + ramp / 4)
    assert costs.throttled_ns(trn2, 500.0, ramp) == 500.0
    assert costs.throttled_ns(get_preset("trn1"), 500.0, 0.0) == 500.0  # trn1: no ramp


def test_throttle_ramp_reengages_only_after_an_idle_gap(trn2):
    from neuron_explorer.backend.hardware import DeviceTimeline

    kernel = lower_op(mm(1024, 1024, 1024), trn2)
    # a cold start loses a quarter of the ramp (rate 50% -> 100% over 3 us of activity)
    assert kernel.te_cold_ns == pytest.approx(trn2.te_throttle_ramp_ns / 4, rel=0.01)
    timeline = DeviceTimeline(trn2)
    first = timeline.schedule(kernel, 0)
    assert first[1] - first[0] == kernel.duration_ns + kernel.te_cold_ns  # cold
    back_to_back = timeline.schedule(kernel, 0)
    assert back_to_back[1] - back_to_back[0] == kernel.duration_ns  # still warm
    late = back_to_back[1] + 10 * trn2.te_throttle_idle_ns
    after_gap = timeline.schedule(kernel, late)
    assert after_gap[1] - after_gap[0] == kernel.duration_ns + kernel.te_cold_ns
    # trn1 has no throttle
    assert lower_op(mm(1024, 1024, 1024), get_preset("trn1")).te_cold_ns == 0


def test_vector_and_scalar_instruction_timing_rules(trn2):
    trn1 = get_preset("trn1")
    # trn1: 128 lanes at 1.12 GHz; one input: N cycles, two inputs: 2N
    assert costs.vector_ns(trn1, 1000, "float32", 1) == pytest.approx(1000 / 1.12)
    assert costs.vector_ns(trn1, 1000, "float32", 2) == pytest.approx(2000 / 1.12)
    # tiny independent instructions are limited by the ~100-cycle static overhead
    assert costs.vector_ns(trn1, 4, "float32", 1) == pytest.approx(100 / 1.12)
    # one that waits for its data adds 100 fixed + 60 per SBUF/PSUM access
    assert costs.dependent_ns(trn1, 1000, 1.12, 1) == pytest.approx((1000 + 100 + 120) / 1.12)
    # trn2: 512 lanes for BF16, 256 otherwise, at 0.96 GHz
    assert costs.vector_ns(trn2, 1024, "bfloat16", 1) == pytest.approx(256 / 0.96)
    assert costs.vector_ns(trn2, 1024, "float32", 1) == pytest.approx(512 / 0.96)
    assert costs.scalar_ns(trn2, 1024, "float32") == pytest.approx(1024 / 1.2)
    # Tensor Engine: max(N, 64) cycles; FP32 4x; weight loads 4x faster
    assert costs.matmul_ns(trn2, 512, "bfloat16") == pytest.approx(512 / 2.4)
    assert costs.matmul_ns(trn2, 16, "bfloat16") == pytest.approx(64 / 2.4)
    assert costs.matmul_ns(trn2, 512, "float32") == pytest.approx(4 * 512 / 2.4)
    assert costs.load_stationary_ns(trn2, 128, "bfloat16") == pytest.approx(32 / 2.4)


def test_only_instructions_waiting_for_data_pay_the_fixed_costs():
    from neuron_explorer.backend.hardware import KernelBuilder

    p = get_preset("trn1")
    free, n = 1024, 32
    chained = KernelBuilder(p, "chain")
    prev: tuple[int, ...] = ()
    for _ in range(n):
        prev = (chained.vector("TensorTensor", free, "float32", 2, prev),)
    independent = KernelBuilder(p, "independent")
    for _ in range(n):
        independent.vector("TensorTensor", free, "float32", 2)
    work = 2 * free / p.vector_clock_ghz
    overhead = (100 + 3 * 60) / p.vector_clock_ghz
    assert chained.build().duration_ns == pytest.approx(n * (work + overhead), rel=0.01)
    # only the first (the engine was idle) pays; the rest pipeline behind it
    assert independent.build().duration_ns == pytest.approx(n * work + overhead, rel=0.01)


def test_flop_and_byte_counts_for_mm_and_add(trn2):
    kernel = lower_op(mm(256, 512, 384, "float32"), trn2)
    assert kernel.model_flops == 2 * 256 * 512 * 384
    # executed: every matmul runs the whole 128x128 array over its moving columns
    assert kernel.flops >= kernel.model_flops
    assert kernel.hbm_bytes == (256 * 512 + 512 * 384 + 256 * 384) * 4  # no re-reads
    assert kernel.hbm_read_bytes == (256 * 512 + 512 * 384) * 4
    elementwise = lower_op(add((300, 70)), trn2)
    assert elementwise.model_flops == 300 * 70
    # executed FLOPs include the lanes of the last, partly filled column of partitions
    assert 300 * 70 <= elementwise.flops < 300 * 70 + 128
    assert elementwise.hbm_bytes == 3 * 300 * 70 * 4


def test_working_set_that_does_not_fit_spills(trn2):
    row = OpSpec("aten::_softmax", (T((64, 131072), "float32"),), (T((64, 131072), "float32"),))
    kernel = lower_op(row, trn2)
    assert kernel.spill_bytes == 64 * 131072 * 4  # the input is read a second time
    assert kernel.hbm_read_bytes == 2 * 64 * 131072 * 4
    fits = OpSpec("aten::_softmax", (T((64, 1024), "float32"),), (T((64, 1024), "float32"),))
    assert lower_op(fits, trn2).spill_bytes == 0
