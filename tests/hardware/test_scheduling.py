"""List scheduling: in-order engines, dependencies, overlap, fused kernels, the device clock."""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import pairwise

import pytest
from neuron_explorer.backend.hardware import (
    DeviceTimeline,
    Gemm,
    KernelBuilder,
    OpSpec,
    TensorSpec,
    emit_gemm,
    get_preset,
    lower_op,
)
from neuron_explorer.backend.hardware.builder import DependencyBudgetExceeded
from neuron_explorer.backend.hardware.streaming import act, stream, vec

T = TensorSpec


@pytest.fixture(scope="module")
def trn2():
    return get_preset("trn2")


def _by_engine(kernel):
    rows = defaultdict(list)
    for engine, opcode, start, dur, _bytes, _flops in kernel.instructions():
        rows[engine].append((start, start + dur, opcode))
    return rows


@pytest.mark.parametrize("spec", [
    OpSpec("aten::mm", (T((1024, 768), "bfloat16"), T((768, 3072), "bfloat16")),
           (T((1024, 3072), "bfloat16"),)),
    OpSpec("aten::_softmax", (T((16, 512, 512), "float32"),), (T((16, 512, 512), "float32"),)),
    OpSpec("aten::_scaled_dot_product_flash_attention", (T((1, 4, 512, 64), "bfloat16"),) * 3,
           (T((1, 4, 512, 64), "bfloat16"),)),
])
def test_each_engine_runs_its_instructions_in_order(spec, trn2):
    kernel = lower_op(spec, trn2)
    for engine, rows in _by_engine(kernel).items():
        starts = [s for s, _e, _o in rows]
        assert starts == sorted(starts), engine
        # nothing on one engine overlaps, except a weight load hidden inside the matmul
        # it overlaps (it nests entirely within it)
        outer_end = -1
        for s, e, opcode in rows:
            if s < outer_end:
                assert opcode == "LoadStationary" and e <= outer_end, (engine, s, e)
            else:
                outer_end = e


def test_dependencies_are_respected_and_engines_overlap(trn2):
    b = KernelBuilder(trn2, "chain")
    load = b.dma_load(1 << 20, 128)
    first = b.vector("TensorTensor", 2048, "float32", 2, load)
    second = b.scalar("Activation", 2048, "float32", 1, (first,))
    independent = b.gpsimd("Iota", 128 * 2048, "int32")
    store = b.dma_store(1 << 20, 128, (second,))
    kernel = b.build()
    rows = kernel.instructions()

    def end(i):
        return rows[i][2] + rows[i][3]

    assert rows[first][2] >= max(end(i) for i in load)
    assert rows[second][2] >= end(first)
    assert all(rows[i][2] >= end(second) for i in store)
    assert rows[independent][2] == 0  # GpSimd had nothing to wait for
    assert kernel.duration_ns == max(end(i) for i in range(len(rows)))


def test_weight_loads_hide_under_the_previous_matmul(trn2):
    b = KernelBuilder(trn2, "weights")
    ready = b.dma_load(1 << 16, 128)
    for _ in range(8):
        b.matmul(128, 128, 512, "bfloat16", ready, weight_deps=ready)
    rows = [r for r in b.build().instructions() if r[0] == "tensor"]
    loads = [r for r in rows if r[1] == "LoadStationary"]
    matmuls = [r for r in rows if r[1] == "MultiplyMoving"]
    for load, previous in zip(loads[1:], matmuls, strict=False):
        assert previous[2] <= load[2] and load[2] + load[3] <= previous[2] + previous[3]
    gaps = [b_[2] - (a[2] + a[3]) for a, b_ in pairwise(matmuls)]
    assert max(gaps) <= 1  # matmuls issue back to back


def test_psum_banks_limit_groups_in_flight(trn2):
    b = KernelBuilder(trn2, "banks")
    emit_gemm(b, Gemm(m=128 * 16, k=128, n=512, dtype="bfloat16", out_dtype="bfloat16"))
    rows = b.build().instructions()
    matmuls = [r for r in rows if r[1] == "MultiplyMoving"]
    copies = [r for r in rows if r[1] == "TensorCopy"]
    assert len(matmuls) == len(copies) == 16
    for g in range(8, 16):  # group g reuses the bank of group g-8: waits for its copy
        assert matmuls[g][2] >= copies[g - 8][2] + copies[g - 8][3]


def test_fused_kernel_keeps_intermediates_in_sbuf(trn2):
    x = T((512, 1024), "bfloat16")
    w = T((1024, 1024), "bfloat16")
    y = T((512, 1024), "bfloat16")
    separate = [
        lower_op(OpSpec("aten::mm", (x, w), (y,)), trn2),
        lower_op(OpSpec("aten::gelu", (y,), (y,)), trn2),
    ]
    b = KernelBuilder(trn2, "fused_mm_gelu")
    done = emit_gemm(b, Gemm(m=512, k=1024, n=1024, dtype="bfloat16", out_dtype="bfloat16",
                             store=False))
    stream(b, y.numel, "bfloat16", [act("Activation", 1, 1.0)], outputs=[y.nbytes], deps=done,
           resident_inputs=1)
    fused = b.build()
    assert fused.hbm_bytes == x.nbytes + w.nbytes + y.nbytes
    assert fused.hbm_bytes < sum(k.hbm_bytes for k in separate)
    assert fused.duration_ns < sum(k.duration_ns for k in separate)
    assert fused.model_flops == sum(k.model_flops for k in separate)


def test_builder_spill_counts_the_reload(trn2):
    b = KernelBuilder(trn2, "spilled")
    made = b.vector("TensorTensor", 4096, "float32", 2)
    back = b.spill(8 << 20, 128, (made,))
    b.vector("TensorTensor", 4096, "float32", 2, back)
    kernel = b.build()
    assert kernel.spill_bytes == 8 << 20
    assert kernel.hbm_read_bytes == kernel.hbm_write_bytes == 8 << 20
    assert {"DmaSpill", "DmaReload"} <= {r[1] for r in kernel.instructions()}


def test_device_timeline_queues_kernels_after_the_launch_latency(trn2):
    kernel = lower_op(OpSpec("aten::add", (T((256, 256), "float32"),) * 2,
                             (T((256, 256), "float32"),)), trn2)
    timeline = DeviceTimeline(trn2)
    start, end = timeline.schedule(kernel, 1_000)
    assert start == 1_000 + trn2.launch_latency_ns and end == start + kernel.duration_ns
    # launched while the first still runs: queued behind it
    start2, end2 = timeline.schedule(kernel, 1_500)
    assert start2 == end and end2 == end + kernel.duration_ns
    # launched long after: the device was idle
    start3, _ = timeline.schedule(kernel, end2 + 10_000)
    assert start3 == end2 + 10_000 + trn2.launch_latency_ns
    assert timeline.finish_ns == start3 + kernel.duration_ns
    assert timeline.busy_ns == 3 * kernel.duration_ns and timeline.kernels == 3
    absolute = kernel.instructions(offset_ns=start3)
    # the kernel starts generating its first load's descriptors (hardware DGE), then the
    # load shows on its queue from its trigger
    assert min(r[2] for r in absolute) == start3 + trn2.dma_issue_ns


def test_streams_overlap_dma_with_compute(trn2):
    b = KernelBuilder(trn2, "stream")
    nbytes = 64 << 20
    stream(b, nbytes // 4, "float32", [vec("TensorTensor", 2, 1.0)], inputs=[nbytes, nbytes],
           outputs=[nbytes])
    kernel = b.build()
    busy = kernel.engine_busy_ns
    assert kernel.duration_ns < busy["dma"] + 0.2 * busy["vector"]


def test_dependencies_must_point_backwards(trn2):
    b = KernelBuilder(trn2, "bad")
    with pytest.raises(ValueError, match="depends on an instruction not yet added"):
        b.vector("TensorCopy", 16, "float32", 1, (0,))


def test_a_dependency_budget_stops_the_adding_at_the_instruction_past_it(trn2):
    b = KernelBuilder(trn2, "budget")
    b.dependency_budget = 3
    a = b.vector("TensorCopy", 16, "float32", 1)
    c = b.vector("TensorCopy", 16, "float32", 1, (a,))
    b.vector("TensorTensor", 16, "float32", 2, (a, c))
    assert b.dependency_count() == 3 and len(b) == 3
    with pytest.raises(DependencyBudgetExceeded):
        b.vector("TensorCopy", 16, "float32", 1, (c,))
    assert b.dependency_count() == 3 and len(b) == 3  # nothing of it added
    b.dependency_budget = math.inf
    d = b.vector("TensorCopy", 16, "float32", 1)
    b.wait_for((d,), (a, c))
    b.wait_for((d,), (a,))  # waited for already: no new dependency
    assert b.dependency_count() == 5


def test_transposes_are_identity_matmuls_copied_out_a_bank_at_a_time(trn2):
    b = KernelBuilder(trn2, "transpose")
    b.transpose(512, 512, "bfloat16")  # 16 blocks of 128x128
    rows = b.build().instructions()
    transposes = [r for r in rows if r[1] == "Transpose"]
    copies = [r for r in rows if r[1] == "TensorCopy"]
    assert len(transposes) == 16 and len(copies) == 4  # one PSUM bank holds four blocks
    assert all(r[5] == 2 * 128 * 128 * 128 for r in transposes)
    assert copies[-1][2] >= transposes[-1][2] + transposes[-1][3]


def test_a_queue_keeps_several_transfers_in_flight():
    """Back-to-back independent transfers: each one's fixed cost runs while the earlier ones
    move data, so the stream is bound by the engines' data rate (plus a fixed cost per
    DMA_QUEUE_DEPTH transfers), not by one fixed cost per transfer."""
    from neuron_explorer.backend.hardware import KernelBuilder, costs, get_preset
    from neuron_explorer.backend.hardware.builder import DMA_QUEUE_DEPTH

    p = get_preset("trn1")
    b = KernelBuilder(p, "stream")
    per_queue = 10
    loads = 32 * per_queue  # round robin over the 32 load queues: 10 on each
    for _ in range(loads):
        b.dma_load(2048, partitions=8, row_bytes=4096)
    k = b.build()
    data = costs.dma_data_ns(p, 2048, 4096)
    one_at_a_time = per_queue * (p.dma_fixed_ns + data)
    waves = -(-per_queue // DMA_QUEUE_DEPTH)  # a queue's transfers, DEPTH at a time
    assert k.duration_ns < 0.5 * one_at_a_time
    # each wave pays one fixed cost; its data (two queues per engine) moves after it
    assert waves * p.dma_fixed_ns <= k.duration_ns <= waves * (
        p.dma_fixed_ns + 2 * DMA_QUEUE_DEPTH * data)
    # a queue's records never overlap
    a = k.arrays()
    for q in set(a["engine"].tolist()):
        mine = a["engine"] == q
        starts, ends = a["start"][mine], a["start"][mine] + a["dur"][mine]
        assert (starts[1:] >= ends[:-1]).all()


def test_the_schedule_runs_with_the_cyclic_collector_paused(trn2, monkeypatch):
    """The schedule's lists hold an entry per instruction, and the collector walked them
    again and again: 17% of a 1.1 M-instruction GEMM's build. It is back on after."""
    import gc

    seen = []
    schedule = KernelBuilder._schedule

    def watched(self):
        seen.append(gc.isenabled())
        return schedule(self)

    monkeypatch.setattr(KernelBuilder, "_schedule", watched)
    spec = OpSpec("aten::mm", (T((256, 128), "bfloat16"), T((128, 512), "bfloat16")),
                  (T((256, 512), "bfloat16"),))
    assert gc.isenabled()
    assert lower_op(spec, trn2).duration_ns > 0
    assert seen == [False] and gc.isenabled()


def _every_kind_of_instruction(p, seed: int) -> KernelBuilder:
    """A kernel with every scheduling kind, in a random order of dependencies: matmuls
    and weight loads (hidden and not), engine ops waiting for data, DMA loads, stores,
    spills and HBM copies (pieces, folded transfers, software descriptors), host
    transfers with a wait after their dependencies."""
    import random

    rng = random.Random(seed)
    b = KernelBuilder(p, f"mixed_{seed}")
    done: list[int] = []

    def some() -> tuple[int, ...]:
        return tuple(rng.sample(done, min(len(done), rng.randint(0, 3))))

    for _ in range(400):
        pick = rng.randrange(9)
        if pick == 0:
            ids = b.dma_load(rng.choice([512, 4096, 65536, 1 << 20]), rng.choice([8, 64, 128]),
                             some(), row_bytes=rng.choice([None, 256.0, 2048.0]),
                             transfers=rng.choice([1, 1, 4]),
                             software_dge=rng.random() < 0.2)
        elif pick == 1:
            ids = b.dma_store(rng.choice([2048, 1 << 18]), 128, some(),
                              spill=rng.random() < 0.2)
        elif pick == 2:
            ids = b.dma_copy(rng.choice([4096, 1 << 20]), None, some(),
                             row_bytes=rng.choice([512.0, 8192.0]))
        elif pick == 3:
            ids = (b.host_transfer(rng.choice(["DmaToHost", "DmaFromHost"]),
                                   rng.choice([64, 1 << 16]), some(),
                                   wait_ns=rng.choice([0.0, 1500.0])),)
        elif pick in (4, 5):
            ids = (b.matmul(128, rng.choice([64, 128]), rng.choice([128, 512]),
                            rng.choice(["bfloat16", "float32"]), some()),)
        elif pick == 6:
            ids = b.spill(rng.choice([8192, 1 << 19]), 128, some())
        else:
            ids = (b.add(rng.randrange(4), "Op", rng.uniform(10, 900), some(),
                         latency=rng.choice([0.0, 64.0])),)
        done.extend(ids)
    return b


@pytest.mark.parametrize("preset", ["trn1", "trn2"])
def test_the_compiled_schedule_gives_the_python_schedules_times_to_the_last_bit(preset):
    """Large kernels are scheduled by compiled code (schedule_compiled.py); every start and
    end, and the Tensor Engine's busy time, must be the Python schedule's exactly."""
    import numpy as np

    p = get_preset(preset)
    builders = [_every_kind_of_instruction(p, seed) for seed in range(6)]
    gemm = KernelBuilder(p, "gemm")
    emit_gemm(gemm, Gemm(1024, 768, 3072, "bfloat16"))
    builders.append(gemm)
    for b in builders:
        start, end, busy = b._schedule()
        c_start, c_end, c_busy = b._schedule_compiled()
        assert np.array_equal(np.asarray(start), c_start), b.name
        assert np.array_equal(np.asarray(end), c_end), b.name
        assert busy == c_busy, b.name


def test_a_dependency_on_a_later_instruction_is_refused_by_the_compiled_schedule_too(trn2):
    b = KernelBuilder(trn2, "backwards")
    first = b.add(0, "Op", 10.0)
    b.add(1, "Op", 10.0, (first,))
    b._deps[0] = (1,)  # as a corrupted program would hold it
    with pytest.raises(ValueError, match="depends on a later one"):
        b._schedule()
    with pytest.raises(ValueError, match="depends on a later one"):
        b._schedule_compiled()


@pytest.mark.parametrize("preset", ["trn1", "trn2"])
def test_waiting_for_the_last_to_end_of_each_engine_is_waiting_for_all(preset):
    """An op's next op waits for the instructions it finished with; of those, only the last
    each engine ran can end last (`_last_to_end`: a padded GEMM finished with 2,048, each
    a dependency of every instruction of the next op). Kernels of every scheduling kind,
    then instructions of each kind waiting for a random set of their instructions, all of
    it or only what `_last_to_end` keeps: the same start and end for every instruction."""
    import random

    import numpy as np

    p = get_preset(preset)
    for seed in range(8):
        rng = random.Random(seed)
        waits = None
        times = []
        for pruned in (False, True):
            b = _every_kind_of_instruction(p, seed)
            if waits is None:
                waits = sorted(rng.sample(range(len(b)), rng.randint(20, 200)))
            deps = b._last_to_end(tuple(waits)) if pruned else tuple(waits)
            assert set(deps) <= set(waits)
            b.dma_load(65536, 128, deps)
            b.dma_store(2048, 128, deps)
            b.matmul(128, 128, 512, "bfloat16", deps)
            for engine in range(4):
                b.add(engine, "Op", 100.0, deps, latency=64.0)
            times.append(b._schedule())
        (start, end, busy), (p_start, p_end, p_busy) = times
        assert np.array_equal(start, p_start) and np.array_equal(end, p_end), seed
        assert busy == p_busy


def test_a_weight_load_hidden_under_a_matmul_does_not_stand_for_it(trn2):
    """The one instruction that can end before one issued ahead of it on its engine: a
    LoadStationary run under the previous matmul. Waiting for both is not waiting for it."""
    b = KernelBuilder(trn2, "hidden")
    first = b.matmul(128, 128, 512, "bfloat16")
    b.matmul(128, 128, 512, "bfloat16")
    load = first + 1  # the second matmul's weights, loaded under the first
    _, end, _ = b._schedule()
    assert end[load] < end[first]
    assert b._last_to_end((first, load)) == (first, load)
