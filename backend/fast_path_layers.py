"""nn.TransformerEncoderLayer's eval fast path, decomposed for compiled graphs.

In eval mode under no_grad, `nn.TransformerEncoderLayer` calls one fused op,
`_transformer_encoder_layer_fwd`, and Dynamo keeps it in the graph as it is. Lowered as
one op, it runs stage by stage from HBM, as eager runs the layer's separate ops; the
same layer with the fast path off reaches the compile path as its GEMMs, attention,
LayerNorms and adds, which fuse and keep their values on chip. A compiler for the chip
sees through the fused op, so here it is given the compile path as those ops (the same
arithmetic as ATen's `transformer_encoder_layer_forward`): a compiled ViT-style server
once ran 34% slower a request after `model.eval()`, its encoder layers 3x slower fused.
A layer with a mask (padding, nested tensors) stays one op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _self_attention(x: Tensor, heads: int, qkv_weight: Tensor, qkv_bias: Tensor,
                    proj_weight: Tensor, proj_bias: Tensor) -> Tensor:
    """`_native_multi_head_attention(x, x, x, ..., need_weights=False)` without a mask:
    the packed in-projection, scaled dot-product attention per head, the out-projection."""
    batch, length, embed = x.shape
    q, k, v = (t.view(batch, length, heads, embed // heads).transpose(1, 2)
               for t in F.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1))
    attended = F.scaled_dot_product_attention(q, k, v)
    return F.linear(attended.transpose(1, 2).reshape(batch, length, embed), proj_weight,
                    proj_bias)


def encoder_layer(src: Tensor, embed_dim: int, num_heads: int, qkv_weight: Tensor,
                  qkv_bias: Tensor, proj_weight: Tensor, proj_bias: Tensor, use_gelu: bool,
                  norm_first: bool, eps: float, norm_weight_1: Tensor, norm_bias_1: Tensor,
                  norm_weight_2: Tensor, norm_bias_2: Tensor, ffn_weight_1: Tensor,
                  ffn_bias_1: Tensor, ffn_weight_2: Tensor, ffn_bias_2: Tensor,
                  mask: Tensor | None = None, mask_type: int | None = None) -> Tensor:
    """`aten::_transformer_encoder_layer_fwd` as its ops; NotImplemented (the op kept)
    with a mask or an input other than (batch, length, embed)."""
    if mask is not None or src.dim() != 3 or src.is_nested:
        return NotImplemented

    def norm(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias) + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def decompositions() -> dict[object, object]:
    """The fused encoder layer as its ops, for compiled graphs."""
    return {torch.ops.aten._transformer_encoder_layer_fwd.default: encoder_layer}
