"""Which aten ops the device runs, and how: op name -> lowering family.

Names are aten names without namespace, overload or in-place suffix ("add" covers
add.Tensor, add_.Scalar, ...: `common.op_families.base_name`). `_foreach_<op>` uses
the entry of <op> once per tensor in one kernel. Ops with no device work (views,
metadata, allocation) are in NO_DEVICE_WORK; everything else not in LOWERINGS runs on
the host (HOST_ONLY lists the usual ones so the reason is clear).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from neuron_explorer.backend.hardware import lower_bag as bag
from neuron_explorer.backend.hardware import lower_distance as dist
from neuron_explorer.backend.hardware import lower_index as ix
from neuron_explorer.backend.hardware import lower_matmul as mmx
from neuron_explorer.backend.hardware import lower_mha as mha
from neuron_explorer.backend.hardware import lower_pointwise as pw
from neuron_explorer.backend.hardware import lower_rowwise as rw
from neuron_explorer.backend.hardware import lower_sort as order
from neuron_explorer.backend.hardware.streaming import act, simd, vec

Lowering = Callable  # (KernelBuilder, OpSpec) -> None

ARITH = [vec(pw.ARITH, 1, 1.0)]
ARITH2 = [vec(pw.ARITH, 1, 1.0), vec(pw.ARITH, 1, 1.0)]
SELECT = [vec("Select", 3, 0.0)]
ACTIVATION = [act("Activation", 1, 1.0)]
ACTIVATION_BACKWARD = [act("Activation", 1, 1.0), vec("TensorTensor", 2, 1.0)]
MASK_BACKWARD = [vec("TensorTensor", 2, 1.0)]
MEMSET = [vec("Memset", 1, 0.0)]
IOTA = [simd("Iota", 1.0)]
RANDOM = [simd("Random", 4.0)]
RANDOM_NORMAL = [simd("Random", 4.0), act("Activation", 1, 2.0)]
ADAM = [vec("TensorTensor", 2, 2.0), vec("TensorTensor", 2, 3.0), act("Activation", 1, 1.0),
        vec("TensorScalar", 1, 2.0), vec("TensorTensor", 2, 2.0), vec("TensorTensor", 2, 2.0)]
SGD = [vec("TensorTensor", 2, 2.0), vec("TensorTensor", 2, 2.0)]

POOL = [vec("TensorReduce", 1, 1.0)]
MOVE = [vec("TensorCopy", 1, 0.0)]
COMPARE_ALL = [vec("TensorTensor", 2, 1.0), vec("TensorReduce", 1, 1.0)]
POOLING = [
    "max_pool2d", "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d",
    "avg_pool3d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
    "max_pool2d_with_indices_backward", "avg_pool2d_backward", "_adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d_backward",
]
RESAMPLING = [
    "upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest2d_backward",
    "upsample_bilinear2d_backward", "tril", "triu",
]
LAYOUT_COPIES = ["constant_pad_nd", "pad", "repeat", "tile", "roll", "flip", "reflection_pad2d"]

VECTOR_ARITHMETIC = [
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod",
    "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_not", "__and__", "__or__", "__xor__", "__iand__", "__ior__", "__ixor__", "neg", "abs",
    "sign", "sgn", "reciprocal", "clamp", "clamp_min", "clamp_max", "clip", "floor", "ceil",
    "round", "trunc", "frac", "square", "pow", "isnan", "isinf", "isfinite", "nan_to_num",
    "hardtanh", "threshold", "heaviside", "copysign", "signbit", "isneginf", "isposinf",
]
VECTOR_TWO_STEP = ["addcmul", "addcdiv", "lerp"]
SCALAR_ACTIVATIONS = [
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid",
    "gelu", "silu", "relu", "relu6", "hardsigmoid", "hardswish", "mish", "softplus", "elu", "selu",
    "celu", "leaky_relu", "erf", "erfc", "erfinv", "sin", "cos", "tan", "atan", "asin", "acos",
    "sinh", "cosh", "logit", "xlogy", "_prelu_kernel", "prelu",
]
ACTIVATION_BACKWARDS = [
    "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "elu_backward",
    "softplus_backward", "mish_backward", "hardswish_backward", "hardsigmoid_backward",
    "logit_backward",
]
MASKED_BACKWARDS = ["threshold_backward", "hardtanh_backward", "leaky_relu_backward"]
COPIES = [
    "_to_copy", "copy", "clone", "contiguous", "_copy_from", "_copy_from_and_resize",
    "lift_fresh_copy", "detach_copy", "alias_copy", "view_copy",
    "expand_copy", "_unsafe_view_copy",
    "convert_element_type",  # prims: a dtype cast (decompositions leave it in graphs)
]
FILLS = [
    "fill", "zero", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
    "new_ones", "new_full", "scalar_tensor",
]
# Backward of indexing views: a zero-filled gradient with the incoming slice written in.
SLICE_BACKWARDS = ["select_backward", "slice_backward", "diagonal_backward"]
# The same with a real `self` around the slice: it is copied, not zeroed.
SLICE_SCATTERS = ["as_strided_scatter", "slice_scatter", "select_scatter", "diagonal_scatter"]
REDUCTIONS = {
    "sum": rw.SUM, "mean": rw.SUM, "nansum": rw.SUM, "nanmean": rw.SUM, "prod": rw.SUM,
    "amax": rw.MINMAX, "amin": rw.MINMAX, "aminmax": rw.MINMAX, "max": rw.MINMAX,
    "min": rw.MINMAX, "any": rw.SUM, "all": rw.SUM, "count_nonzero": rw.SUM,
    "argmax": rw.ARGMINMAX, "argmin": rw.ARGMINMAX, "logsumexp": rw.LOGSUMEXP,
    "var": rw.VAR, "std": rw.VAR, "var_mean": rw.VAR, "std_mean": rw.VAR,
    "norm": rw.NORM, "linalg_vector_norm": rw.NORM, "frobenius_norm": rw.NORM,
    "cumsum": rw.SCAN, "cumprod": rw.SCAN, "logcumsumexp": rw.SCAN,
    "mse_loss": rw.MSE, "l1_loss": rw.MSE, "smooth_l1_loss": rw.MSE, "huber_loss": rw.MSE,
    "binary_cross_entropy": rw.BCE_LOGITS, "binary_cross_entropy_with_logits": rw.BCE_LOGITS,
}
ROWS = {
    "softmax": rw.SOFTMAX, "_softmax": rw.SOFTMAX, "_safe_softmax": rw.SOFTMAX,
    "log_softmax": rw.LOG_SOFTMAX,
    "_log_softmax": rw.LOG_SOFTMAX, "_softmax_backward_data": rw.SOFTMAX_BACKWARD,
    "_log_softmax_backward_data": rw.LOG_SOFTMAX_BACKWARD,
    "layer_norm": rw.LAYER_NORM, "native_layer_norm": rw.LAYER_NORM,
    "native_layer_norm_backward": rw.LAYER_NORM_BACKWARD,
    "group_norm": rw.LAYER_NORM, "native_group_norm": rw.LAYER_NORM,
    "native_group_norm_backward": rw.LAYER_NORM_BACKWARD,
    "batch_norm": rw.LAYER_NORM, "native_batch_norm": rw.LAYER_NORM,
    "_native_batch_norm_legit": rw.LAYER_NORM,
    "_native_batch_norm_legit_no_training": rw.LAYER_NORM,
    "_batch_norm_with_update": rw.LAYER_NORM, "native_batch_norm_backward":
    rw.LAYER_NORM_BACKWARD, "batch_norm_backward": rw.LAYER_NORM_BACKWARD,
    "rms_norm": rw.RMS_NORM, "_fused_rms_norm": rw.RMS_NORM,
    "_fused_rms_norm_backward": rw.LAYER_NORM_BACKWARD,
    "cross_entropy_loss": rw.LOG_SOFTMAX,
    "mse_loss_backward": MASK_BACKWARD, "smooth_l1_loss_backward": MASK_BACKWARD,
    "huber_loss_backward": MASK_BACKWARD, "l1_loss_backward": MASK_BACKWARD,
    "binary_cross_entropy_backward": ACTIVATION_BACKWARD,
}

LOWERINGS: dict[str, Lowering] = {}
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=ARITH) for n in VECTOR_ARITHMETIC})
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=ARITH2) for n in VECTOR_TWO_STEP})
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=ACTIVATION) for n in SCALAR_ACTIVATIONS})
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=ACTIVATION_BACKWARD)
                  for n in ACTIVATION_BACKWARDS})
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=MASK_BACKWARD) for n in MASKED_BACKWARDS})
LOWERINGS.update({n: pw.lower_copy for n in COPIES})
LOWERINGS.update({n: partial(pw.lower_generate, steps=MEMSET) for n in FILLS})
LOWERINGS.update({n: partial(pw.lower_generate, steps=MEMSET) for n in SLICE_BACKWARDS})
LOWERINGS.update({n: pw.lower_slice_scatter for n in SLICE_SCATTERS})
LOWERINGS.update({n: partial(rw.lower_reduction, steps=s) for n, s in REDUCTIONS.items()})
LOWERINGS.update({n: partial(rw.lower_rows, steps=s) for n, s in ROWS.items()})
LOWERINGS.update({n: partial(rw.lower_reduction, steps=POOL) for n in POOLING})
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=ARITH) for n in RESAMPLING})
LOWERINGS.update({n: partial(pw.lower_pointwise, steps=MOVE) for n in LAYOUT_COPIES})
LOWERINGS.update({
    "cat": pw.lower_concat,
    "stack": pw.lower_concat,
    "equal": partial(rw.lower_reduction, steps=COMPARE_ALL),
    "glu": partial(pw.lower_glu, steps=ACTIVATION_BACKWARD),
    "eye": partial(pw.lower_generate, steps=IOTA),
    "_fused_dropout": pw.lower_dropout,
    # AMP grad scaler: unscale every gradient and flag infinities, one kernel per list
    "_amp_foreach_non_finite_check_and_unscale": partial(
        pw.lower_foreach, base=partial(pw.lower_pointwise, steps=ARITH2)),
    "_amp_update_scale": partial(pw.lower_pointwise, steps=ARITH2),
    "where": partial(pw.lower_pointwise, steps=SELECT),
    "masked_fill": partial(pw.lower_pointwise, steps=SELECT),
    "arange": partial(pw.lower_generate, steps=IOTA),
    "linspace": partial(pw.lower_generate, steps=IOTA),
    "range": partial(pw.lower_generate, steps=IOTA),
    "uniform": partial(pw.lower_generate, steps=RANDOM),
    "rand": partial(pw.lower_generate, steps=RANDOM),
    "rand_like": partial(pw.lower_generate, steps=RANDOM),
    "random": partial(pw.lower_generate, steps=RANDOM),
    "randint": partial(pw.lower_generate, steps=RANDOM),
    "randint_like": partial(pw.lower_generate, steps=RANDOM),
    "bernoulli": partial(pw.lower_generate, steps=RANDOM),
    "exponential": partial(pw.lower_generate, steps=RANDOM_NORMAL),
    "normal": partial(pw.lower_generate, steps=RANDOM_NORMAL),
    "randn": partial(pw.lower_generate, steps=RANDOM_NORMAL),
    "randn_like": partial(pw.lower_generate, steps=RANDOM_NORMAL),
    "native_dropout": pw.lower_dropout,
    "dropout": pw.lower_dropout,
    "native_dropout_backward": partial(pw.lower_pointwise, steps=MASK_BACKWARD),
    "_fused_adam": partial(pw.lower_fused_optimizer, steps=ADAM),
    "_fused_adamw": partial(pw.lower_fused_optimizer, steps=ADAM),
    "_fused_sgd": partial(pw.lower_fused_optimizer, steps=SGD),
    "nll_loss": rw.lower_nll_loss,
    "nll_loss_forward": rw.lower_nll_loss,
    "nll_loss2d_forward": rw.lower_nll_loss,
    "nll_loss_nd": rw.lower_nll_loss,
    "nll_loss_backward": rw.lower_nll_loss_backward,
    "nll_loss2d_backward": rw.lower_nll_loss_backward,
    "embedding": ix.lower_embedding,
    "embedding_dense_backward": ix.lower_embedding_backward,
    "embedding_backward": ix.lower_embedding_backward,
    "index_select": ix.lower_index_select,
    "index": ix.lower_index_select,
    "gather": ix.lower_gather,
    "scatter": ix.lower_scatter,
    "scatter_add": ix.lower_scatter,
    "scatter_reduce": ix.lower_scatter,
    "index_add": ix.lower_scatter,
    "index_copy": ix.lower_scatter,
    "index_put": ix.lower_scatter,
    "_index_put_impl": ix.lower_scatter,
    "index_fill": ix.lower_index_fill,
    "masked_scatter": ix.lower_scatter,
    "mm": mmx.lower_mm,
    "bmm": mmx.lower_mm,
    "matmul": mmx.lower_mm,
    "mv": mmx.lower_mm,
    "addmm": partial(mmx.lower_mm, bias_first=True),
    "baddbmm": partial(mmx.lower_mm, bias_first=True),
    "addbmm": mmx.lower_addbmm,
    "addmv": partial(mmx.lower_mm, bias_first=True),
    "linear": mmx.lower_linear,
    "dot": mmx.lower_dot,
    "vdot": mmx.lower_dot,
    "convolution": mmx.lower_convolution,
    "convolution_overrideable": mmx.lower_convolution,
    "_convolution": mmx.lower_convolution,
    "conv1d": mmx.lower_convolution,
    "conv2d": mmx.lower_convolution,
    "conv3d": mmx.lower_convolution,
    "convolution_backward": mmx.lower_convolution_backward,
    "t_copy": mmx.lower_transpose_copy,
    "transpose_copy": mmx.lower_transpose_copy,
    "permute_copy": mmx.lower_transpose_copy,
    "convolution_backward_overrideable": mmx.lower_convolution_backward,
})
ATTENTION = [
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward", "_efficient_attention_forward",
]
ATTENTION_BACKWARD = [
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
    "_efficient_attention_backward",
]
# Paths a model takes without asking: sorting and counting on GpSimd, distances
# through the Tensor Engine, bags of embeddings, the attention layers' eval fast paths.
LOWERINGS.update({
    "sort": order.lower_sort,
    "argsort": order.lower_sort,
    "topk": order.lower_topk,
    "searchsorted": order.lower_searchsorted,
    "bincount": order.lower_bincount,
    "_cdist_forward": dist.lower_cdist,
    "_embedding_bag": bag.lower_embedding_bag,
    "_embedding_bag_forward_only": bag.lower_embedding_bag,
    "embedding_bag": bag.lower_embedding_bag,
    "_native_multi_head_attention": mha.lower_native_mha,
    "_transformer_encoder_layer_fwd": mha.lower_encoder_layer,
})
LOWERINGS.update({n: mmx.lower_attention for n in ATTENTION})
LOWERINGS.update({n: mmx.lower_attention_backward for n in ATTENTION_BACKWARD})

# Views, metadata and allocation: no kernel at all.
NO_DEVICE_WORK = frozenset([
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "expand_as", "t",
    "transpose", "permute", "unsqueeze", "squeeze", "detach", "alias", "slice", "select", "narrow",
    "split", "split_with_sizes", "chunk", "unbind", "view_as", "view_as_real", "view_as_complex",
    "diagonal", "movedim", "unflatten", "flatten", "unfold", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "set", "resize", "resize_as",
    "_resize_output", "size", "stride", "sym_size", "sym_stride", "sym_numel", "numel", "dim",
    "lift_fresh", "_conj", "_neg_view", "resolve_conj", "resolve_neg", "conj", "real", "imag",
    "_local_scalar_dense", "record_stream", "is_pinned", "_pin_memory",
    "_has_compatible_shallow_copy_type", "is_same_size", "_nested_tensor_from_mask_left_aligned",
    # Dynamo's checks on its size symbols (a data-dependent size >= 0): host ints, no tensor
    "_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
])

# The usual ops the device cannot run: data-dependent output sizes, FFTs and matrix
# decompositions. They (and anything else not in LOWERINGS) run on the host.
HOST_ONLY = frozenset([
    "kthvalue", "median", "nanmedian", "mode", "unique", "_unique",
    "_unique2", "unique_consecutive", "unique_dim", "nonzero", "nonzero_static", "masked_select",
    "histc", "histogram", "bucketize", "multinomial", "randperm",
    "cummax", "cummin", "_fft_r2c", "_fft_c2r", "_fft_c2c", "linalg_svd", "_linalg_svd",
    "linalg_qr", "linalg_eigh", "_linalg_eigh", "linalg_eig", "linalg_cholesky_ex",
    "linalg_lu_factor_ex", "linalg_solve_ex", "_linalg_solve_ex", "linalg_inv_ex", "linalg_det",
    "_linalg_det", "_linalg_slogdet", "triangular_solve", "cholesky_solve", "linalg_lstsq",
    "cholesky", "svd",
])


def lowering_for(base: str) -> Lowering | None:
    """The lowering of an op base name, `_foreach_*` included; None if there is none."""
    fn = LOWERINGS.get(base)
    if fn is None and base.startswith("_foreach_"):
        inner = LOWERINGS.get(base[len("_foreach_"):])
        if inner is not None:
            fn = partial(pw.lower_foreach, base=inner)
    return fn


# Lowerings whose work is "the same steps on every tile": they can join a stream.
STREAM_FAMILIES = (pw.lower_pointwise, pw.lower_generate, rw.lower_reduction, rw.lower_rows)

