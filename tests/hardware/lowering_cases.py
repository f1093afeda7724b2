"""One op spec per lowering, with its model FLOPs and HBM bytes in closed form.

Each case gives the op realistic arguments (the dims differ, so a swapped dim shows)
and the numbers its kernel must report: FLOPs (`Kernel.model_flops`), bytes read from
and written to HBM. Where the count of FLOPs per element is a choice of the model
rather than a law (one FLOP for an activation, whatever the function), the constant
below says so. None marks a number on which the model and the physics disagree; the
physically right number is asserted by an xfail test in test_lowering.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_explorer.backend.hardware import OpSpec, TensorSpec

T = TensorSpec
F = "float32"
BF = "bfloat16"
I64 = "int64"
B1 = "bool"


@dataclass(frozen=True)
class Case:
    spec: OpSpec
    flops: int | None  # Kernel.model_flops
    reads: int | None  # Kernel.hbm_read_bytes
    writes: int | None  # Kernel.hbm_write_bytes


CASES: dict[str, Case] = {}


def nbytes(*tensors: TensorSpec) -> int:
    return sum(t.nbytes for t in tensors)


ALL = -1  # bytes: every input read once, every output written once


def add(names: str, ins: tuple[TensorSpec, ...], outs: tuple[TensorSpec, ...],
        flops: int | None, *, reads: int | None = ALL, writes: int | None = ALL,
        **attrs: object) -> None:
    """One case for each of the space-separated op names."""
    for name in names.split():
        spec = OpSpec("aten::" + name, ins, outs, attrs or None)
        CASES[name] = Case(spec, flops, nbytes(*ins) if reads == ALL else reads,
                           nbytes(*outs) if writes == ALL else writes)


X = T((64, 128), F)  # 8192 elements
N = X.numel
X16 = T((64, 128), BF)
XB = T((64, 128), B1)  # masks and comparison results: one byte an element
ROW = T((64,), F)  # one value per row of X
COL = T((128,), F)  # one value per column of X (weights, biases)
STAT = T((64, 1), F)
IDX = T((64,), I64)
TABLE = T((1000, 128), F)
SCALAR = T((), F)
IMG = T((2, 16, 14, 14), F)
HALF_IMG = T((2, 16, 7, 7), F)
CH = T((16,), F)

# ---- elementwise: one output element per input element ------------------------------
# The model's convention: one FLOP per element and Vector or Scalar Engine instruction,
# so an arithmetic op, a comparison and an activation (exp, gelu, erf...) are each 1.
add("add", (X, COL), (X,), N)  # the broadcast bias is read once
add("mul", (X16, X16), (X16,), N)
add("sub rsub div true_divide floor_divide remainder fmod maximum minimum fmax fmin pow "
    "heaviside copysign xlogy _prelu_kernel", (X, X), (X,), N)
add("eq ne lt le gt ge logical_and logical_or logical_xor", (X, X), (XB,), N)
add("isnan isinf isfinite signbit isneginf isposinf logical_not", (X,), (XB,), N)
INT8 = T((64, 128), "int8")
add("bitwise_and bitwise_or bitwise_xor __and__ __or__ __xor__ __iand__ __ior__ __ixor__",
    (INT8, INT8), (INT8,), N)
add("bitwise_not", (INT8,), (INT8,), N)
add("neg abs sign sgn reciprocal clamp clamp_min clamp_max clip floor ceil round trunc frac "
    "square nan_to_num hardtanh threshold", (X,), (X,), N)
add("prelu", (X, COL), (X,), N)
add("exp exp2 expm1 log log2 log10 log1p sqrt rsqrt tanh sigmoid relu relu6 hardsigmoid "
    "hardswish mish softplus elu selu celu leaky_relu erf erfc erfinv sin cos tan atan asin "
    "acos sinh cosh logit", (X,), (X,), N)
add("gelu silu", (X16,), (X16,), N)
# two instructions: value * t1 (op) t2, then + self; lerp: weight * (end - start) + start
add("addcmul addcdiv lerp", (X, X, X), (X,), 2 * N)
# backward of an activation: its derivative (1) times the incoming gradient (1)
add("gelu_backward silu_backward sigmoid_backward tanh_backward elu_backward "
    "softplus_backward mish_backward hardswish_backward hardsigmoid_backward logit_backward "
    "binary_cross_entropy_backward", (X, X), (X,), 2 * N)
# backward through a mask: one select-multiply
add("threshold_backward hardtanh_backward leaky_relu_backward mse_loss_backward "
    "smooth_l1_loss_backward huber_loss_backward l1_loss_backward", (X, X), (X,), N)
add("native_dropout_backward", (X, XB), (X,), N)
add("where", (XB, X, X), (X,), 0)  # a select is no arithmetic
add("masked_fill", (X, XB), (X,), 0)
add("tril triu", (X,), (X,), N)
# a sigmoid and a product per output element (half the input's); both halves read
add("glu", (X,), (T((64, 64), F),), 2 * 64 * 64)
add("_amp_foreach_non_finite_check_and_unscale", (X,), (), 2 * N, writes=X.nbytes)
ONE = T((1,), F)
add("_amp_update_scale", (ONE, T((1,), "int32"), ONE), (ONE, T((1,), "int32")), 2)

# ---- resampling (1 FLOP per element of the larger side) and layout copies (0) ----------
UP = T((2, 16, 28, 28), F)
add("upsample_nearest2d upsample_bilinear2d", (IMG,), (UP,), UP.numel)
add("upsample_nearest2d_backward upsample_bilinear2d_backward", (UP,), (IMG,), UP.numel)
add("constant_pad_nd pad", (X,), (T((64, 130), F),), 0)
add("repeat tile", (X,), (T((128, 256), F),), 0)
add("roll flip", (X,), (X,), 0)
add("reflection_pad2d", (IMG,), (T((2, 16, 16, 16), F),), 0)
add("cat", (X, T((32, 128), F)), (T((96, 128), F),), 0)
add("stack", (X, X), (T((2, 64, 128), F),), 0)

# ---- copies: every byte read once and written once, no FLOPs ---------------------------
add("copy clone contiguous _copy_from _copy_from_and_resize lift_fresh_copy detach_copy "
    "alias_copy view_copy expand_copy _unsafe_view_copy", (X,), (X,), 0)
add("_to_copy convert_element_type", (X,), (X16,), 0)  # a dtype change: 4 bytes in, 2 out
# a copy into a new layout; moving the last dim runs identity matmuls (executed FLOPs only)
add("t_copy transpose_copy", (X,), (T((128, 64), F),), 0)
add("permute_copy", (IMG,), (T((16, 2, 14, 14), F),), 0, dims=(1, 0, 2, 3))

# ---- generated values: nothing read, the output written --------------------------------
add("zeros ones full scalar_tensor", (), (X,), 0)
add("zeros_like ones_like full_like new_zeros new_ones new_full", (X,), (X,), 0, reads=0)
add("fill zero", (X,), (), 0, reads=0, writes=X.nbytes)  # in place
add("rand randint", (), (X,), 0)  # random bits on GpSimd count no FLOPs (model's choice)
add("rand_like randint_like", (X,), (X,), 0, reads=0)
add("uniform random bernoulli", (X,), (), 0, reads=0, writes=X.nbytes)
# normal values: a transform of the random bits, 2 FLOPs an element (model's choice)
add("randn", (), (X,), 2 * N)
add("randn_like", (X,), (X,), 2 * N, reads=0)
add("normal exponential", (X,), (), 2 * N, reads=0, writes=X.nbytes)
add("arange", (), (T((1000,), I64),), 0)
add("linspace range", (), (T((1000,), F),), 0)
add("eye", (), (T((64, 64), F),), 0)
# backward of an indexing view: a zero gradient with the incoming slice written in
add("select_backward", (COL,), (X,), 0, dim=0, index=3)
add("slice_backward", (T((32, 128), F),), (X,), 0)
add("diagonal_backward", (ROW,), (X,), 0)
# the *_scatter ops: `self` outside the slice is copied and `src` into it: as many bytes
# read as `self` holds
for _name, _src in (("slice_scatter", T((32, 128), F)), ("select_scatter", COL),
                    ("diagonal_scatter", ROW), ("as_strided_scatter", T((32, 128), F))):
    add(_name, (X, _src), (X,), 0, reads=X.nbytes)

# ---- dropout: random bits (0), then mask (1) and scale (1) ---------------------------
add("native_dropout", (X,), (X, XB), 2 * N)
add("dropout", (X,), (X,), 2 * N)
add("_fused_dropout", (X,), (X, T((64, 128), "uint8")), 2 * N)

# ---- reductions: the input read once, the (small) result written ---------------------
add("sum mean nansum nanmean prod amax amin", (X,), (ROW,), N, dim=(1,))
add("aminmax", (X,), (ROW, ROW), N, dim=1)
add("max min", (X,), (ROW, IDX), N, dim=1)
add("argmax argmin", (X,), (IDX,), N, dim=1)  # the index picked on GpSimd counts 0
add("any all", (XB,), (T((), B1),), N)
add("count_nonzero", (X,), (T((64,), I64),), N, dim=(1,))
add("cumsum cumprod logcumsumexp", (X,), (X,), N, dim=1)  # a scan writes in full
add("logsumexp", (X,), (ROW,), 3 * N, dim=(1,))  # max 1, exp(x - max) 2 (model's choice)
add("var std", (X,), (ROW,), 4 * N, dim=(1,))  # BnStats 3, BnAggr 1 (model's choice)
add("var_mean std_mean", (X,), (ROW, ROW), 4 * N, dim=(1,))
add("norm linalg_vector_norm frobenius_norm", (X,), (SCALAR,), 2 * N)  # square, add
add("mse_loss l1_loss smooth_l1_loss huber_loss", (X, X), (SCALAR,), 3 * N)  # sub, sq, add
# log, log(1 - x), two products, the sum: 7 FLOPs an element (model's choice)
add("binary_cross_entropy binary_cross_entropy_with_logits", (X, X), (SCALAR,), 7 * N)
add("equal", (X, X), (T((), B1),), 2 * N)  # compare, then reduce
# pooling: one compare (max) or add (avg) per input element, non-overlapping windows
add("max_pool2d avg_pool2d", (IMG,), (HALF_IMG,), IMG.numel, kernel_size=(2, 2))
add("max_pool2d_with_indices", (IMG,), (HALF_IMG, T(HALF_IMG.shape, I64)), IMG.numel)
VOL, HALF_VOL = T((1, 4, 8, 8, 8), F), T((1, 4, 4, 4, 4), F)
add("avg_pool3d", (VOL,), (HALF_VOL,), VOL.numel)
add("max_pool3d_with_indices", (VOL,), (HALF_VOL, T(HALF_VOL.shape, I64)), VOL.numel)
POOLED = T((2, 16, 1, 1), F)
add("adaptive_avg_pool2d _adaptive_avg_pool2d", (IMG,), (POOLED,), IMG.numel)
add("adaptive_max_pool2d", (IMG,), (POOLED, T(POOLED.shape, I64)), IMG.numel)
# pooling backward: one FLOP per incoming gradient element; `self` only gives the shape
add("avg_pool2d_backward", (HALF_IMG, IMG), (IMG,), HALF_IMG.numel, reads=HALF_IMG.nbytes)
add("_adaptive_avg_pool2d_backward", (POOLED, IMG), (IMG,), POOLED.numel,
    reads=POOLED.nbytes)
add("max_pool2d_with_indices_backward", (HALF_IMG, IMG, T(HALF_IMG.shape, I64)), (IMG,),
    HALF_IMG.numel, reads=HALF_IMG.nbytes + HALF_IMG.numel * 8)
add("adaptive_max_pool2d_backward", (POOLED, IMG, T(POOLED.shape, I64)), (IMG,),
    POOLED.numel, reads=POOLED.nbytes + POOLED.numel * 8)

# ---- row-wise: softmax and normalisations, per element of the input ------------------
# softmax: max 1, exp(x - max) with the running sum 3, divide 1
add("softmax _softmax _safe_softmax log_softmax _log_softmax", (X,), (X,), 5 * N, dim=1)
add("cross_entropy_loss", (X, IDX), (SCALAR,), 5 * N)
# softmax backward: dot(grad, y) 2, subtract 1, multiply 1 (model's choice for log_softmax)
add("_softmax_backward_data _log_softmax_backward_data", (X, X), (X,), 4 * N)
# layer norm: statistics 3 + 1, normalise 2, scale 1, shift 1 (model's choice)
add("layer_norm", (X, COL, COL), (X,), 8 * N)
add("native_layer_norm", (X, COL, COL), (X, STAT, STAT), 8 * N)
add("group_norm", (IMG, CH, CH), (IMG,), 8 * IMG.numel)
add("native_group_norm", (IMG, CH, CH), (IMG, T((2, 4), F), T((2, 4), F)), 8 * IMG.numel)
add("batch_norm _batch_norm_with_update", (IMG, CH, CH), (IMG,), 8 * IMG.numel)
add("native_batch_norm _native_batch_norm_legit", (IMG, CH, CH), (IMG, CH, CH),
    8 * IMG.numel)
add("_native_batch_norm_legit_no_training", (IMG, CH, CH, CH, CH), (IMG, CH, CH),
    8 * IMG.numel)
add("rms_norm", (X, COL), (X,), 4 * N)  # square-mean 2, scale 1, weight 1
add("_fused_rms_norm", (X, COL), (X, STAT), 4 * N)
# norm backward: 14 FLOPs an element (model's choice)
add("native_layer_norm_backward", (X, X, STAT, STAT, COL, COL), (X, COL, COL), 14 * N)
add("_fused_rms_norm_backward", (X, X, STAT, COL), (X, COL), 14 * N)
add("native_group_norm_backward", (IMG, IMG, T((2, 4), F), T((2, 4), F), CH), (IMG, CH, CH),
    14 * IMG.numel)
add("native_batch_norm_backward batch_norm_backward", (IMG, IMG, CH, CH, CH), (IMG, CH, CH),
    14 * IMG.numel)

# ---- losses over picked elements: only the target's logits are read ------------------
add("nll_loss nll_loss_forward nll_loss2d_forward", (X, IDX), (SCALAR, SCALAR), 64,
    reads=IDX.nbytes + 64 * 4)
add("nll_loss_nd", (X, IDX), (SCALAR,), 64, reads=IDX.nbytes + 64 * 4)
# backward: the gradient zeroed, then one element per target written, scaled by the
# incoming gradient (read with the targets)
add("nll_loss_backward nll_loss2d_backward", (SCALAR, X, IDX), (X,), 0,
    reads=IDX.nbytes + SCALAR.nbytes, writes=X.nbytes + 64 * 4)

# ---- index ops: rows move by indirect DMA, no FLOPs except accumulation -------------
ROW_BYTES = 128 * 4
add("embedding", (T((1000, 128), BF), IDX), (X16,), 0, reads=IDX.nbytes + 64 * 128 * 2)
add("index_select index", (TABLE, IDX), (X,), 0, reads=IDX.nbytes + 64 * ROW_BYTES)
# the table zeroed, then one gradient row added per index (the DMA accumulates: a write)
add("embedding_dense_backward embedding_backward", (X, IDX), (TABLE,), N,
    writes=TABLE.nbytes + 64 * ROW_BYTES)
add("gather", (X, T((64, 1), I64)), (T((64, 1), F),), 0)  # `self` fits in SBUF: read once
# in place: the values and indices read, one row written per index
for _name, _flops in (("scatter", 0), ("scatter_add", N), ("index_add", N), ("index_copy", 0),
                      ("index_put", 0), ("_index_put_impl", 0), ("scatter_reduce", 0)):
    add(_name, (TABLE, IDX, X), (), _flops, reads=IDX.nbytes + X.nbytes, writes=X.nbytes)
# whole rows along dim 0 set to a scalar: nothing but the indices read
add("index_fill", (TABLE, IDX), (), 0, reads=IDX.nbytes, writes=64 * ROW_BYTES, dim=0)
add("masked_scatter", (X, XB, X), (), 0, reads=XB.nbytes + X.nbytes, writes=X.nbytes)
BAGS, BAG_IDX, OFFSETS = T((16, 128), F), T((200,), I64), T((16,), I64)
# one add per gathered element into its bag
add("_embedding_bag _embedding_bag_forward_only embedding_bag", (TABLE, BAG_IDX, OFFSETS),
    (BAGS, T((200,), I64), T((16,), I64), T((16,), I64)), 200 * 128,
    reads=OFFSETS.nbytes + BAG_IDX.nbytes + 200 * ROW_BYTES)

# ---- ordering on GpSimd: steps per element of the algorithm (model's choice) ---------
XI = T((64, 128), I64)
add("sort", (X,), (X, XI), 28 * N, dim=-1)  # bitonic: L (L + 1) / 2 for rows of 2^L, L = 7
add("argsort", (X,), (XI,), 28 * N, dim=-1)
TOP = T((64, 5), F)
add("topk", (X,), (TOP, T(TOP.shape, I64)), 4 * N, dim=-1)  # log2(k) + 1 rounded up, k = 5
VALUES = T((64, 16), F)
add("searchsorted", (X, VALUES), (T(VALUES.shape, I64),), 8 * VALUES.numel)  # log2(128) + 1
add("bincount", (T((1000,), I64),), (T((100,), I64),), 1000)

# ---- fused optimizers: per element, read param, grad and moments, write them back ---
PARAMS = (X, COL)
P_ELEMS, P_BYTES = N + COL.numel, nbytes(*PARAMS)
STEPS = (SCALAR, SCALAR)
# Adam: moments 2 + 3, sqrt 1, bias corrections 2, update 2 + 2 (model's choice)
add("_fused_adam _fused_adamw", PARAMS * 4 + STEPS, (), 12 * P_ELEMS, reads=4 * P_BYTES,
    writes=3 * P_BYTES)
add("_fused_sgd", PARAMS * 2, (), 4 * P_ELEMS, writes=P_BYTES)  # weight decay, update

# ---- matmuls: 2 M N K, plus M N for an added input -----------------------------------
M, K, NN = 64, 128, 96
A, B, C = T((M, K), F), T((K, NN), F), T((M, NN), F)
add("mm", (A, B), (C,), 2 * M * NN * K)
add("addmm", (T((NN,), F), A, B), (C,), 2 * M * NN * K + M * NN)
add("linear", (A, T((NN, K), F), T((NN,), F)), (C,), 2 * M * NN * K + M * NN)
BA, BB, BC = T((4, M, K), F), T((4, K, 32), F), T((4, M, 32), F)
add("bmm", (BA, BB), (BC,), 2 * 4 * M * 32 * K)
add("baddbmm", (BC, BA, BB), (BC,), 2 * 4 * M * 32 * K + 4 * M * 32)
# the batch sums away: one [M, 32] result written once, its input added once
add("addbmm", (T((M, 32), F), BA, BB), (T((M, 32), F),), 2 * 4 * M * 32 * K + M * 32)
# shared weights: the batch folds into the rows and the weights are read once
add("matmul", (BA, T((K, 32), F)), (BC,), 2 * 4 * M * 32 * K)
add("mv", (A, T((K,), F)), (ROW,), 2 * M * K)
add("addmv", (ROW, A, T((K,), F)), (ROW,), 2 * M * K + M)
add("dot vdot", (T((K,), BF), T((K,), BF)), (T((), BF),), 2 * K)

# ---- convolutions: an implicit GEMM, 2 N Cout Hout Wout Cin kh kw / groups -----------
W3 = T((32, 16, 3, 3), F)
OUT = T((2, 32, 12, 12), F)
CONV = 2 * 2 * 32 * 12 * 12 * 16 * 3 * 3
add("convolution conv2d", (IMG, W3, T((32,), F)), (OUT,), CONV + OUT.numel, groups=1)
add("_convolution", (IMG, W3), (OUT,), CONV, groups=1)
add("convolution_overrideable", (IMG, T((32, 8, 3, 3), F)), (OUT,), CONV // 2, groups=2)
add("conv1d", (T((2, 16, 50), F), T((32, 16, 3), F)), (T((2, 32, 48), F),),
    2 * 2 * 32 * 48 * 16 * 3)
add("conv3d", (VOL, T((8, 4, 3, 3, 3), F)), (T((1, 8, 6, 6, 6), F),),
    2 * 1 * 8 * 6 ** 3 * 4 * 27)
# backward: grad_input and grad_weight are each a GEMM as large as the forward, grad_bias
# sums the incoming gradient; the model reads the gradient once per product. Written
# bytes: see the xfail test.
add("convolution_backward convolution_backward_overrideable", (OUT, IMG, W3),
    (IMG, W3, T((32,), F)), 2 * CONV + OUT.numel, reads=3 * OUT.nbytes + nbytes(IMG, W3),
    writes=None, groups=1)

# ---- attention: two GEMMs, softmax (4 FLOPs a score: the model's flash convention) ---
BH, L, S, E = 2 * 4, 128, 256, 64
Q, KV, LSE = T((2, 4, L, E), BF), T((2, 4, S, E), BF), T((2, 4, L), F)
SCORES = BH * L * S
ATTENTION = 2 * 2 * SCORES * E + 4 * SCORES
add("scaled_dot_product_attention _scaled_dot_product_attention_math "
    "_scaled_dot_product_efficient_attention _scaled_dot_product_fused_attention_overrideable "
    "_scaled_dot_product_cudnn_attention _efficient_attention_forward", (Q, KV, KV), (Q,),
    ATTENTION)
add("_scaled_dot_product_flash_attention _flash_attention_forward", (Q, KV, KV), (Q, LSE),
    ATTENTION)
# backward: the scores recomputed, then dV, dP, dQ, dK: five GEMMs; softmax forward 4
# and backward 4 FLOPs a score; the saved output and logsumexp are read
add("_scaled_dot_product_flash_attention_backward "
    "_scaled_dot_product_efficient_attention_backward "
    "_scaled_dot_product_fused_attention_overrideable_backward "
    "_scaled_dot_product_cudnn_attention_backward _flash_attention_backward "
    "_efficient_attention_backward", (Q, Q, KV, KV, Q, LSE), (Q, KV, KV),
    5 * 2 * SCORES * E + 8 * SCORES)

# ---- distances: ||x||^2 + ||y||^2 - 2 x.y through the Tensor Engine ----------------
X1, X2 = T((2, 64, 32), F), T((2, 96, 32), F)
DIST = T((2, 64, 96), F)
# the GEMM, the squared norms (2 an element), + the norms and the sqrt (3 an output)
add("_cdist_forward", (X1, X2), (DIST,), 2 * 2 * 64 * 96 * 32 + 2 * (X1.numel + X2.numel)
    + 3 * DIST.numel)

# ---- the attention layers' fast paths: their GEMMs, attention and norms --------------
SEQ, EMB, HEADS = T((2, 16, 64), F), 64, 4
ROWS = 2 * 16
PROJ = 2 * ROWS * EMB * EMB + ROWS * EMB  # one projection with its bias
MHA = 4 * PROJ + 2 * 2 * (2 * HEADS) * 16 * 16 * (EMB // HEADS) + 4 * (2 * HEADS) * 16 * 16
STAGED = 3 * ROWS * EMB * 4  # q, k and v go through HBM between the stages
# reads: query, key, value and the attention's result; four weights and biases; q, k, v
MHA_READS = 4 * SEQ.nbytes + 4 * (EMB * EMB + EMB) * 4 + STAGED
MHA_WRITES = 2 * SEQ.nbytes + STAGED  # the attention's result and the output
add("_native_multi_head_attention", (SEQ, SEQ, SEQ), (SEQ,), MHA, reads=MHA_READS,
    writes=MHA_WRITES, embed_dim=EMB, num_head=HEADS)
FFN = 128
ENCODER = (MHA + 2 * 9 * SEQ.numel  # two residual adds (1) and LayerNorms (8)
           + 2 * ROWS * EMB * FFN + ROWS * FFN + ROWS * FFN  # FFN up, bias, activation
           + 2 * ROWS * FFN * EMB + ROWS * EMB)  # FFN down, bias
NORMS_READ = 2 * (SEQ.nbytes + 2 * EMB * 4)  # each norm: its input, weight and bias
FFN_READ = (SEQ.nbytes + (EMB * FFN + FFN) * 4) + (ROWS * FFN * 4 + (FFN * EMB + EMB) * 4)
add("_transformer_encoder_layer_fwd", (SEQ,) + (T((FFN, EMB), F),) * 10, (SEQ,), ENCODER,
    reads=MHA_READS + NORMS_READ + FFN_READ,
    writes=MHA_WRITES + 2 * SEQ.nbytes + ROWS * FFN * 4 + SEQ.nbytes,
    embed_dim=EMB, num_heads=HEADS)
