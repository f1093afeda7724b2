"""The eval fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer:
`_native_multi_head_attention` and `_transformer_encoder_layer_fwd`, as the GEMMs
and the flash-style attention the same layers run as separate ops.

The in-projection is three GEMMs (q, k and v against their third of the packed
weight), attention is the SDPA kernel over batch x heads, the out-projection one
GEMM; the encoder layer adds its residuals and LayerNorms (Vector Engine streams)
and its feed-forward GEMMs with the activation applied as the result leaves PSUM.
Each stage starts when the one before it is done.
"""

from __future__ import annotations

from collections.abc import Callable

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.gemm import Gemm, emit_gemm
from neuron_explorer.backend.hardware.lower_matmul import lower_attention
from neuron_explorer.backend.hardware.lower_rowwise import LAYER_NORM
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.streaming import act, stream, vec

_RESIDUAL = [vec("TensorTensor", 2, 1.0)]
_ACTIVATION = [act("Activation", 1, 1.0)]


def _after(b: KernelBuilder, deps: tuple[int, ...], emit: Callable[[], object]) -> tuple[int, ...]:
    """Run `emit` with its first instructions waiting for `deps`; its last ids."""
    start, saved = len(b), b.after
    b.after = tuple(deps) or saved
    emit()
    b.after = saved
    return b.finished(start)


def _linear(b: KernelBuilder, rows: int, k: int, n: int, dtype: str, bias: bool
            ) -> tuple[int, ...]:
    es = TensorSpec((1,), dtype).itemsize
    return tuple(emit_gemm(b, Gemm(m=rows, k=k, n=n, dtype=dtype, out_dtype=dtype,
                                   a_bytes=rows * k * es, b_bytes=k * n * es,
                                   bias_bytes=n * es if bias else 0)))


def _attention(b: KernelBuilder, spec: OpSpec, query: TensorSpec, key: TensorSpec,
               embed: int, heads: int, weights_out: TensorSpec | None) -> tuple[int, ...]:
    """In-projection, attention over batch x heads, out-projection; the last ids."""
    dtype = query.dtype
    batch = query.shape[0] if len(query.shape) == 3 else 1
    lq = query.shape[-2] if len(query.shape) >= 2 else 1
    s = key.shape[-2] if len(key.shape) >= 2 else 1
    hd = max(embed // max(heads, 1), 1)
    proj: tuple[int, ...] = ()
    for rows in (batch * lq, batch * s, batch * s):  # q, k, v projections
        proj = proj + _linear(b, rows, embed, embed, dtype, bias=True)
    q = TensorSpec((batch * heads, lq, hd), dtype)
    kv = TensorSpec((batch * heads, s, hd), dtype)
    outputs = (q,) + ((weights_out,) if weights_out is not None else ())
    sdpa = OpSpec("aten::_scaled_dot_product_attention_math", (q, kv, kv), outputs)
    attended = _after(b, proj, lambda: lower_attention(b, sdpa))
    return _after(b, attended,
                  lambda: _linear(b, batch * lq, embed, embed, dtype, bias=True))


def lower_native_mha(b: KernelBuilder, spec: OpSpec) -> None:
    """_native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight,
    qkv_bias, proj_weight, proj_bias, mask, need_weights, ...) -> (out, weights)."""
    query, key = spec.inputs[0], spec.inputs[1]
    embed = spec.attr("embed_dim", query.shape[-1] if query.shape else 1)
    heads = spec.attr("num_head", 1)
    weights = spec.outputs[1] if len(spec.outputs) > 1 and spec.outputs[1].numel else None
    _attention(b, spec, query, key, embed, heads, weights)


def lower_encoder_layer(b: KernelBuilder, spec: OpSpec) -> None:
    """_transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias,
    proj_weight, proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
    norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
    mask, mask_type) -> out."""
    src = spec.inputs[0]
    embed = spec.attr("embed_dim", src.shape[-1] if src.shape else 1)
    heads = spec.attr("num_heads", 1)
    ffn_weight = spec.inputs[9] if len(spec.inputs) > 9 else TensorSpec((4 * embed, embed))
    hidden = ffn_weight.shape[0] if ffn_weight.shape else 4 * embed
    rows = max(src.numel // max(embed, 1), 1)
    dtype = src.dtype
    nbytes = src.nbytes

    def norm(deps: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(stream(b, src.numel, dtype, _RESIDUAL + list(LAYER_NORM), deps=deps,
                            inputs=[nbytes], outputs=[nbytes], small_inputs=[2 * embed * 4]))

    done = _attention(b, spec, src, src, embed, heads, None)
    done = norm(done)  # src + attention, LayerNorm
    hidden_done = _after(b, done, lambda: _linear(b, rows, embed, hidden, dtype, bias=True))
    hidden_done = tuple(stream(b, rows * hidden, dtype, _ACTIVATION, deps=hidden_done,
                               resident_inputs=1))
    done = _after(b, hidden_done, lambda: _linear(b, rows, hidden, embed, dtype, bias=True))
    norm(done)  # + the feed-forward, LayerNorm
