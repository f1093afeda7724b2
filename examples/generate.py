"""Greedy generation with a small decoder and a KV cache: a prefill, then one token a call.

The first call reads the whole prompt (prefill); each later call feeds the one token
just chosen per sequence and attends over the cached keys and values (decode).
`Trace.phases()` tells the two apart and `Trace.serving()` gives the time to first
token, the time per output token and tokens/s.

    python examples/generate.py [--new-tokens 16] [--prompt 24] [--batch 4]
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None) -> tuple:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:  # keys and values of the tokens before these
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        # a prompt attends causally; one new token attends to everything cached
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x)), [k, v]


class Decoder(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 2, heads: int = 4,
                 max_len: int = 128) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, cache: list | None = None) -> tuple:
        past = 0 if cache is None else cache[0][0].shape[2]
        pos = torch.arange(past, past + ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.pos(pos)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            new_cache.append(kv)
        return self.head(self.norm(x)), new_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Decoder().to(args.device).eval()
    prompt = torch.randint(0, 512, (args.batch, args.prompt)).to(args.device)
    out: list[list[int]] = []
    with torch.inference_mode():
        logits, cache = model(prompt)  # prefill
        for _ in range(args.new_tokens):
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(token.flatten().tolist())  # streamed to the client: waits for it
            if len(out) == args.new_tokens:
                break
            logits, cache = model(token, cache)  # decode: one token per sequence
    print("first sequence:", [tokens[0] for tokens in out])


if __name__ == "__main__":
    main()
