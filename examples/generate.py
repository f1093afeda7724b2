"""Greedy generation with a small decoder and a KV cache: a prefill, then one token a call.

The first call reads the whole prompt (prefill); each later call feeds the one token
just chosen per sequence and attends over the cached keys and values (decode).
`Trace.phases()` tells the two apart and `Trace.serving()` gives the time to first
token, the time per output token and tokens/s.

    python examples/generate.py [--new-tokens 16] [--prompt 24] [--batch 4]
    python examples/generate.py --compile                  # torch.compile(backend="neuron")
    python examples/generate.py --compile --static-cache   # a cache of fixed length: no new sizes
    python examples/generate.py --compile --dynamic        # mark_dynamic on the cache's length
    python examples/generate.py --compile --static-shapes  # dynamic=False: a compile per length
    python examples/generate.py --no-cache                 # each call reads the whole sequence
    python examples/generate.py --bf16                     # the model and its cache in bfloat16

The cache grows by one position a call, so a compiled decode step sees new sizes every
call. Dynamo makes the length symbolic after its first change (or at once with
`--dynamic`), and the graph compiles once for every length; `--static-shapes` keeps
every size fixed, so each new length compiles a graph of its own; `--static-cache`
avoids new sizes altogether: the cache is allocated at its full length, written in
place, and attention is masked to the positions filled so far. `--no-cache` keeps no
cache at all: each call feeds the whole sequence so far, as a first generation loop
often does, and computes every position's keys and values again.
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

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None,
                positions: torch.Tensor | None = None) -> tuple:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if positions is not None and positions.dim() == 2:  # a position per sequence
            # (serve.py's requests, each at its own length): write each row's own positions
            at = positions[:, None, :, None].expand(b, self.heads, t, d // self.heads)
            cache[0].scatter_(2, at, k)
            cache[1].scatter_(2, at, v)
            k, v = cache
            mask = torch.arange(k.shape[2], device=x.device) <= positions[:, None, :, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif positions is not None:  # a static cache: write these positions in place
            cache[0].index_copy_(2, positions, k)
            cache[1].index_copy_(2, positions, v)
            k, v = cache
            # each query sees the keys up to its own position, none of the unfilled ones
            mask = torch.arange(k.shape[2], device=x.device) <= positions[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
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
        self.heads, self.max_len = heads, max_len
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, cache: list | None = None,
                positions: torch.Tensor | None = None) -> tuple:
        """`positions` (those of `ids`' tokens: `[t]` for the whole batch, or `[b, t]`, a
        row per sequence) means `cache` is a static one, from `static_cache`, written in
        place; without it the cache grows by concatenation."""
        static = positions is not None
        if positions is None:
            past = 0 if cache is None else cache[0][0].shape[2]
            positions = torch.arange(past, past + ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.pos(positions)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i], positions if static else None)
            new_cache.append(kv)
        return self.head(self.norm(x)), new_cache

    def static_cache(self, batch: int, length: int, device: torch.device | str) -> list:
        """Keys and values of every layer, allocated once for `length` positions."""
        d = self.head.in_features
        shape = (batch, self.heads, length, d // self.heads)
        dtype = self.head.weight.dtype
        return [[torch.zeros(shape, device=device, dtype=dtype) for _ in range(2)]
                for _ in self.blocks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--compile", action="store_true",
                        help='torch.compile(model, backend="neuron")')
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--static-cache", action="store_true",
                        help="a cache of fixed length written in place: the same sizes every call")
    shapes.add_argument("--dynamic", action="store_true",
                        help="torch._dynamo.mark_dynamic on the cache's length dimension")
    shapes.add_argument("--static-shapes", action="store_true",
                        help="torch.compile(..., dynamic=False): every size is fixed")
    shapes.add_argument("--no-cache", action="store_true",
                        help="no KV cache: each call feeds the whole sequence so far")
    parser.add_argument("--bf16", action="store_true",
                        help="the model (and so its cache) in bfloat16, model.to(torch.bfloat16)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Decoder().to(args.device).eval()
    if args.bf16:
        model = model.to(torch.bfloat16)
    if args.prompt + args.new_tokens > model.max_len:
        parser.error(f"--prompt plus --new-tokens must be at most {model.max_len}")
    step = model
    if args.compile:
        step = torch.compile(model, backend="neuron", dynamic=False if args.static_shapes else None)
    prompt = torch.randint(0, 512, (args.batch, args.prompt)).to(args.device)
    out: list[list[int]] = []
    with torch.inference_mode():
        cache, positions = None, None
        if args.static_cache:
            cache = model.static_cache(args.batch, args.prompt + args.new_tokens, args.device)
            positions = torch.arange(args.prompt, device=args.device)
        logits, cache = step(prompt, cache, positions)  # prefill
        ids = prompt
        for i in range(args.new_tokens):
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(token.flatten().tolist())  # streamed to the client: waits for it
            if len(out) == args.new_tokens:
                break
            if args.static_cache:  # the position of the new token
                positions = torch.full((1,), args.prompt + i, device=args.device)
            elif args.dynamic:  # the cache's length changes every call: compile for any
                for kv in cache:
                    for t in kv:
                        torch._dynamo.mark_dynamic(t, 2)
            if args.no_cache:  # the whole sequence again, one token longer
                ids = torch.cat([ids, token], dim=1)
                logits, _ = step(ids)
                continue
            logits, cache = step(token, cache, positions)  # decode: one token per sequence
    print("first sequence:", [tokens[0] for tokens in out])


if __name__ == "__main__":
    main()
