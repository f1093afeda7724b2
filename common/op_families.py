"""Op families: which aten ops are matmuls, convolutions, attention and losses, in one table.

The backend's lowering, compiler, numerics and what-if replay and the explorer's rules
and analyses read it. Ops are named by their overload packet (`mm`, `conv2d`,
`_scaled_dot_product_flash_attention`); `family` and the `is_*` functions also take the
names a trace records (`aten::addmm`, `aten::add_.Tensor`, a schema name, a bare name).
Elementwise and reduction ops are not listed here: the compiler reads them from PyTorch's
own op tags (`torch.Tag.pointwise`, `torch.Tag.reduction`).
"""

from __future__ import annotations

MATMUL = "matmul"
CONVOLUTION = "convolution"
ATTENTION = "attention"

FAMILIES: dict[str, frozenset[str]] = {
    # Products of matrices and vectors (linear, matmul and einsum decompose into the others).
    MATMUL: frozenset({
        "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
        "matmul", "linear", "einsum",
    }),
    # Convolutions, forward and backward, at every level PyTorch dispatches them.
    CONVOLUTION: frozenset({
        "convolution", "_convolution", "convolution_overrideable", "conv1d", "conv2d",
        "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
        "conv_depthwise3d", "convolution_backward", "convolution_backward_overrideable",
        "conv_tbc_backward",
    }),
    # Scaled dot-product attention, forward and backward, and its per-backend kernels.
    ATTENTION: frozenset({
        "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_attention_math_for_mps", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
        "_efficient_attention_forward", "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_fused_attention_overrideable_backward",
        "_flash_attention_backward", "_efficient_attention_backward",
    }),
}

# Within the matmul family: the GEMMs, one (batched) product of two matrices, plus an
# added input for addmm and baddbmm; what the other matmuls become in a compiled graph.
GEMM = frozenset({"mm", "bmm", "addmm", "baddbmm"})
# The GEMMs over a batch of matrices (attention's per-head products).
BATCHED_GEMM = frozenset({"bmm", "baddbmm"})
# Matmuls whose first operand is the input added to the product (input + A @ B).
ADDS_INPUT = frozenset({"addmm", "baddbmm", "addbmm", "addmv"})

# Loss functions as aten runs them (cross_entropy as log_softmax and nll_loss), forward and
# backward: eager ones beside compiled graphs are a loss left out of the compiled function.
LOSSES = frozenset({
    "mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward",
    "huber_loss", "huber_loss_backward", "nll_loss", "nll_loss_forward", "nll_loss_backward",
    "nll_loss2d", "nll_loss2d_forward", "nll_loss2d_backward", "nll_loss_nd",
    "cross_entropy_loss", "binary_cross_entropy", "binary_cross_entropy_backward",
    "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss",
    "soft_margin_loss_backward", "multi_margin_loss", "multi_margin_loss_backward",
    "multilabel_margin_loss_forward", "multilabel_margin_loss_backward",
    "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss",
    "poisson_nll_loss", "triplet_margin_loss", "ctc_loss", "_ctc_loss", "_ctc_loss_backward",
})

# Ops whose output's size depends on the values read: Dynamo breaks the graph at each unless
# `torch._dynamo.config.capture_dynamic_output_shape_ops` is set.
DATA_DEPENDENT_SHAPES = frozenset({
    "nonzero", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "unique_dim_consecutive",
})

# Ops whose products run on the Tensor Engine in their operands' dtype.
MATMUL_LIKE = FAMILIES[MATMUL] | FAMILIES[CONVOLUTION] | FAMILIES[ATTENTION]
# Whole layers PyTorch runs as one op at inference (nn.TransformerEncoderLayer's and
# nn.MultiheadAttention's fast path): their weights' dims are the dims of the matmuls inside.
FUSED_LAYERS = frozenset({"_transformer_encoder_layer_fwd", "_native_multi_head_attention"})

_FAMILY_OF = {op: name for name, ops in FAMILIES.items() for op in ops}


def base_name(name: str) -> str:
    """The overload packet of an op name: 'aten::add_.Tensor' -> 'add';
    '_foreach_mul_' -> '_foreach_mul' (an in-place op reads as its functional form)."""
    if "::" in name:
        name = name.split("::", 1)[1]
    name = name.split(".", 1)[0]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name


def family(name: str) -> str | None:
    """The family of an op ('aten::addmm' -> 'matmul'); None for an op of no family."""
    return _FAMILY_OF.get(base_name(name))


def is_matmul(name: str) -> bool:
    return base_name(name) in FAMILIES[MATMUL]


def is_convolution(name: str) -> bool:
    return base_name(name) in FAMILIES[CONVOLUTION]


def is_attention(name: str) -> bool:
    return base_name(name) in FAMILIES[ATTENTION]


def is_matmul_like(name: str) -> bool:
    """A matmul, convolution or attention: its products run on the Tensor Engine, at the
    rate of its operands' dtype."""
    return base_name(name) in MATMUL_LIKE


def runs_matmuls(name: str) -> bool:
    """A matmul-like op, or a whole layer PyTorch's fast path runs as one op (its matmuls
    inside): the ops whose Tensor Engine work a dtype changes."""
    return is_matmul_like(name) or base_name(name) in FUSED_LAYERS
