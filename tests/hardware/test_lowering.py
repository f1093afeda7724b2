"""Op lowering: each op's FLOPs and bytes in closed form, views, host fallback, the kernel
cache and determinism."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowering_cases import CASES
from neuron_explorer.backend.hardware import (
    ENGINE_NAMES,
    HOST_ONLY,
    LOWERINGS,
    Kernel,
    NoLowering,
    OpSpec,
    TensorSpec,
    clear_cache,
    get_preset,
    lower_host_fallback,
    lower_host_transfer,
    lower_op,
)
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.common.op_families import base_name

T = TensorSpec
F = "float32"
X = T((64, 128), F)
IDX = T((64,), "int64")
IMG = T((2, 16, 14, 14), F)
W3 = T((32, 16, 3, 3), F)


@pytest.fixture(scope="module")
def trn2():
    return get_preset("trn2")


def test_every_lowering_has_a_case_with_closed_forms():
    assert set(CASES) == set(LOWERINGS)


# The DMA engine adds scatter_add's values in place: no compute engine executes them.
ADDED_BY_DMA = {"scatter_add", "index_add"}


@pytest.mark.parametrize("name", sorted(LOWERINGS))
def test_every_table_op_lowers_to_its_flops_and_bytes(name, trn2):
    case = CASES[name]
    kernel = lower_op(case.spec, trn2)
    assert isinstance(kernel, Kernel)
    assert kernel.duration_ns > 0 and len(kernel) > 0
    engines = {row[0] for row in kernel.instructions()}
    assert engines <= set(ENGINE_NAMES)
    if case.flops is not None:
        assert kernel.model_flops == case.flops
    if case.reads is not None:
        assert kernel.hbm_read_bytes == case.reads
    if case.writes is not None:
        assert kernel.hbm_write_bytes == case.writes
    assert kernel.hbm_bytes == kernel.hbm_read_bytes + kernel.hbm_write_bytes > 0
    if name not in ADDED_BY_DMA:  # executed FLOPs count the padding of tiles too
        assert kernel.flops >= kernel.model_flops


# What the physics says where the model disagrees: (model FLOPs, bytes read, written).
PHYSICAL = {
    # grad_input is written at the input's size (the fold to it happens on chip, as the
    # forward's unfold does), not as the unfolded [N*Hout*Wout, Cin*kh*kw] columns
    "convolution_backward": (None, None, IMG.nbytes + W3.nbytes + T((32,), F).nbytes),
}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="model != physics"))
    for name in sorted(PHYSICAL)])
def test_physical_numbers_where_the_model_disagrees(name, trn2):
    kernel = lower_op(CASES[name].spec, trn2)
    got = (kernel.model_flops, kernel.hbm_read_bytes, kernel.hbm_write_bytes)
    want = PHYSICAL[name]
    assert tuple(g if w is not None else None for g, w in zip(got, want, strict=True)) == want


def test_a_fused_optimizer_updates_each_parameter_of_one_shape(trn2):
    """Parameters all of one shape: the shapes have no period to tell the lists apart,
    the written list or the state steps (one a parameter) say how many there are."""
    p, step = T((256, 256), F), T((), F)
    written = lower_op(OpSpec("aten::_fused_adam_", (p,) * 12 + (step,) * 3, (p,) * 3), trn2)
    recorded_before = lower_op(OpSpec("aten::_fused_adam_", (p,) * 12 + (step,) * 3, (p,)),
                               trn2)
    for kernel in (written, recorded_before):
        assert (kernel.hbm_read_bytes, kernel.hbm_write_bytes) == (12 * p.nbytes, 9 * p.nbytes)


def test_foreach_ops_use_their_base_op_per_tensor(trn2):
    a, b = T((256, 256), F), T((1024,), F)
    foreach = lower_op(OpSpec("aten::_foreach_mul_", (a, b, a, b), ()), trn2)
    single = lower_op(OpSpec("aten::mul", (a, a), (a,)), trn2)
    assert foreach.hbm_bytes == 3 * (a.nbytes + b.nbytes)
    assert foreach.model_flops == a.numel + b.numel
    assert foreach.duration_ns >= single.duration_ns
    norms = lower_op(OpSpec("aten::_foreach_norm", (a, b), (T((), F), T((), F))), trn2)
    assert norms.hbm_read_bytes == a.nbytes + b.nbytes


def test_op_names_lose_namespace_overload_and_in_place_suffix(trn2):
    assert base_name("aten::add_.Tensor") == "add"
    assert base_name("aten::_foreach_add_.List") == "_foreach_add"
    assert base_name("aten::__and__.Tensor") == "__and__"
    out_of_place = lower_op(OpSpec("aten::add", (X, X), (X,)), trn2)
    in_place = lower_op(OpSpec("aten::add_", (X, X), ()), trn2)
    assert in_place.hbm_bytes == out_of_place.hbm_bytes  # self is read and written back


def test_views_and_metadata_have_no_kernel(trn2):
    for name in ("aten::view", "aten::t", "aten::as_strided", "aten::empty", "aten::detach"):
        assert lower_op(OpSpec(name, (X,), (X,)), trn2) is None
    empty = T((0, 128), F)
    assert lower_op(OpSpec("aten::add", (empty, empty), (empty,)), trn2) is None


def test_unsupported_ops_raise_no_lowering_and_cost_a_host_round_trip(trn2):
    spec = OpSpec("aten::cummax", (T((4096,), F),), (T((4096,), F), T((4096,), "int64")))
    assert "cummax" in HOST_ONLY
    with pytest.raises(NoLowering) as info:
        lower_op(spec, trn2)
    assert isinstance(info.value, NeuronExplorerError)
    assert "aten::cummax" in str(info.value) and "host" in str(info.value)
    with pytest.raises(NoLowering):  # cached, raised again
        lower_op(spec, trn2)
    with pytest.raises(NoLowering):
        lower_op(OpSpec("aten::made_up_op", (X,), (X,)), trn2)
    fallback = lower_host_fallback(spec, trn2)
    assert fallback.fallback
    opcodes = [row[1] for row in fallback.instructions()]
    assert opcodes == ["DmaToHost", "DmaFromHost", "DmaFromHost"]
    moved = 4096 * 4 + 4096 * 4 + 4096 * 8
    link_ns = moved / trn2.host_link_bytes_per_ns
    assert fallback.duration_ns > trn2.host_fallback_fixed_ns + link_ns
    assert fallback.hbm_bytes == moved


def test_host_transfers_use_the_host_link(trn2):
    up = lower_host_transfer(1 << 20, trn2, to_device=True)
    down = lower_host_transfer(1 << 20, trn2, to_device=False)
    assert up.instructions()[0][1] == "DmaFromHost" and down.instructions()[0][1] == "DmaToHost"
    expected = trn2.dma_fixed_ns + (1 << 20) / trn2.host_link_bytes_per_ns
    assert up.duration_ns == pytest.approx(expected, abs=2)
    assert up.hbm_write_bytes == 1 << 20 and down.hbm_read_bytes == 1 << 20


def test_cache_returns_the_same_kernel_for_the_same_signature(trn2):
    spec = OpSpec("aten::gelu", (X,), (X,), {"approximate": "tanh"})
    same = OpSpec("aten::gelu", (T((64, 128), F),), (T((64, 128), F),), {"approximate": "tanh"})
    assert spec == same and hash(spec) == hash(same)
    assert lower_op(spec, trn2) is lower_op(same, trn2)
    other = OpSpec("aten::gelu", (X,), (X,), {"approximate": "none"})
    assert other != spec


def test_attrs_are_frozen_and_hashable():
    spec = OpSpec("aten::sum", (X,), (T((64,), F),), {"dim": [1], "keepdim": False})
    assert spec.attr("dim") == (1,)
    assert spec.attr("missing", 7) == 7
    with pytest.raises(AttributeError):
        spec.name = "aten::mean"  # type: ignore[misc]
    assert hash(spec) == hash(OpSpec("aten::sum", (X,), (T((64,), F),),
                                     {"keepdim": False, "dim": (1,)}))
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_same_spec_gives_an_identical_schedule_after_a_fresh_lowering(trn2):
    spec = OpSpec("aten::addmm", (T((512,), F), T((300, 700), F), T((700, 512), F)),
                  (T((300, 512), F),))
    first = lower_op(spec, trn2)
    clear_cache()
    second = lower_op(spec, trn2)
    assert first is not second
    assert first.instructions() == second.instructions()
    for key, array in first.arrays().items():
        assert np.array_equal(array, second.arrays()[key]), key
    assert (first.duration_ns, first.flops, first.hbm_bytes) == (
        second.duration_ns, second.flops, second.hbm_bytes)


def test_kernel_names_say_op_dtype_and_dims(trn2):
    spec = OpSpec("aten::mm", (T((128, 512), "bfloat16"), T((512, 256), "bfloat16")),
                  (T((128, 256), "bfloat16"),))
    assert lower_op(spec, trn2).name == "mm_bf16_128x512x256"
    assert lower_op(OpSpec("aten::add", (X, X), (X,)), trn2).name == "add_f32_64x128"


def test_large_kernels_stay_compact(trn2):
    spec = OpSpec("aten::mm", (T((8192, 8192), "bfloat16"), T((8192, 8192), "bfloat16")),
                  (T((8192, 8192), "bfloat16"),))
    kernel = lower_op(spec, trn2)
    # matmuls are folded beyond 4096 instruction pairs; each [128, 512] store spreads
    # over the 16 DMA engines (8 partitions each)
    assert len(kernel) < 70_000
    assert kernel.arrays()["start"].dtype == np.int64
    assert kernel.model_flops == 2 * 8192**3
    assert kernel.flops == kernel.model_flops  # every dim a multiple of 128 and 512


def test_stream_steps_expose_the_per_tile_chain_for_fusion():
    from neuron_explorer.backend.compiler.stream_steps import steps_for

    gelu = steps_for("gelu", 1)
    assert [(st.engine, st.opcode) for st in gelu] == [(2, "Activation")]
    assert len(steps_for("native_layer_norm", 1)) == 5
    assert steps_for("mm", 2) is None and steps_for("embedding", 2) is None


def test_long_streams_fold_tiles_but_keep_time_and_bytes(trn2):
    big = T((16384, 16384), F)
    kernel = lower_op(OpSpec("aten::add", (big, big), (big,)), trn2)
    assert len(kernel) < 20_000
    assert kernel.hbm_bytes == 3 * big.nbytes
    bound = min(trn2.hbm_bytes_per_ns, trn2.dma_bytes_per_ns)
    assert kernel.duration_ns == pytest.approx(kernel.hbm_bytes / bound, rel=0.1)
    with pytest.raises(ValueError):
        kernel.arrays()["start"][0] = 5  # cached kernels are read-only


def test_layout_changes_use_tensor_engine_transposes(trn2):
    x = T((8, 512, 256), "bfloat16")
    moved_last = lower_op(OpSpec("aten::transpose_copy", (x,), (T((8, 256, 512), "bfloat16"),),
                                 {"dim0": 1, "dim1": 2}), trn2)
    opcodes = {row[1] for row in moved_last.instructions()}
    assert "Transpose" in opcodes
    assert moved_last.model_flops == 0 and moved_last.flops > 0  # identity matmuls
    kept_last = lower_op(OpSpec("aten::permute_copy", (x,), (T((512, 8, 256), "bfloat16"),),
                                {"dims": (1, 0, 2)}), trn2)
    assert {row[1] for row in kept_last.instructions()} == {"DmaCopy"}
    assert kept_last.hbm_bytes == moved_last.hbm_bytes == 2 * x.nbytes


def test_attention_transposes_probabilities_and_keeps_scores_on_chip(trn2):
    q = T((1, 4, 512, 64), "bfloat16")
    kernel = lower_op(OpSpec("aten::_scaled_dot_product_flash_attention", (q, q, q), (q,)),
                      trn2)
    assert kernel.hbm_bytes == 4 * q.nbytes  # q, k, v in, output out: no scores in HBM
    scores = 4 * 512 * 512
    # two GEMMs of 2*L*S*E each, plus the softmax (max, exp, sum) per score
    assert kernel.model_flops == 2 * 2 * scores * 64 + 4 * scores
    assert "Transpose" in {row[1] for row in kernel.instructions()}
    assert kernel.flops > kernel.model_flops


def test_matmul_with_shared_weights_folds_the_batch_into_rows(trn2):
    x = T((8, 128, 768), "bfloat16")
    w = T((768, 3072), "bfloat16")
    kernel = lower_op(OpSpec("aten::matmul", (x, w), (T((8, 128, 3072), "bfloat16"),)), trn2)
    assert kernel.hbm_bytes == x.nbytes + w.nbytes + 8 * 128 * 3072 * 2  # weights read once


def test_convolution_flops_match_the_implicit_gemm(trn2):
    x = T((4, 32, 28, 28), F)
    w = T((64, 32, 3, 3), F)
    out = T((4, 64, 26, 26), F)
    conv = lower_op(OpSpec("aten::convolution", (x, w), (out,), {"groups": 1}), trn2)
    assert conv.model_flops == 2 * (4 * 26 * 26) * (32 * 9) * 64
    # inputs, weights and the result each cross HBM once (the unfold happens on chip)
    assert conv.hbm_bytes == x.nbytes + w.nbytes + out.nbytes
    up_w = T((64, 32, 2, 2), F)  # transposed: weight is [C_in, C_out, kh, kw]
    up = lower_op(OpSpec("aten::convolution", (T((4, 64, 14, 14), F), up_w),
                         (T((4, 32, 28, 28), F),), {"transposed": True, "groups": 1}), trn2)
    assert up.model_flops == 2 * (4 * 14 * 14) * 64 * (32 * 4)
