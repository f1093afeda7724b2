"""Autocast's policy for neuron, as data: which ops run in the lower precision and which
in float32 (PyTorch's CUDA policy). `backend/autocast.py` registers its kernels from these
lists; the what-if replay predicts an autocast run of a float32 recording from them.

The lists name the ops autocast intercepts (before PyTorch decomposes them); a recording
names what runs: `cross_entropy_loss` is recorded as `_log_softmax` and `nll_loss_forward`,
`layer_norm` as `native_layer_norm`. `runs_in_float32` reads a recorded name.
"""

from __future__ import annotations

from neuron_explorer.common.op_families import base_name

# Ops that run in the lower precision (the Tensor Engine's dtypes), as on CUDA.
LOWER_PRECISION = (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "addr",
    "einsum", "conv1d", "conv2d", "conv3d", "convolution", "_convolution",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input",
    "scaled_dot_product_attention", "prelu",
)
# Ops that need float32 range or accuracy.
FLOAT32 = (
    "softmax.int", "log_softmax.int", "cross_entropy_loss", "nll_loss", "nll_loss_nd",
    "layer_norm", "group_norm", "batch_norm", "mse_loss", "l1_loss", "smooth_l1_loss",
    "binary_cross_entropy_with_logits", "kl_div", "exp", "log", "pow.Tensor_Scalar",
    "sum", "sum.dim_IntList", "prod", "cumsum", "norm.Scalar", "norm.ScalarOpt_dim",
    "rsqrt", "erfinv", "cosine_similarity",
)
# What the FLOAT32 ops are recorded as, where PyTorch decomposes them.
_FLOAT32_RECORDED = frozenset({
    "_softmax", "_log_softmax", "nll_loss_forward", "nll_loss2d_forward",
    "native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
    "_batch_norm_no_update", "linalg_vector_norm",
}) | {base_name(n) for n in FLOAT32}
# A backward op's name is its forward op's with one of these endings.
_BACKWARD_ENDINGS = ("_backward_data", "_backward")


def runs_in_float32(name: str, backward: bool = False) -> bool:
    """Whether autocast runs the recorded op `name` in float32; `backward`: whether the op
    is the backward of such an op (`native_layer_norm_backward`), which autograd runs in
    the forward's float32 too."""
    base = base_name(name)
    if backward:
        for ending in _BACKWARD_ENDINGS:
            if base.endswith(ending):
                return base[: -len(ending)] in _FLOAT32_RECORDED
        return False
    return base in _FLOAT32_RECORDED
