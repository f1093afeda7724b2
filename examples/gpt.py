"""A small GPT-style language model, trained eagerly or with torch.compile.

    python gpt.py               # eager: hundreds of small kernels per step
    python gpt.py --compile     # torch.compile(backend="neuron"): fused kernels

Record both and compare them with `neuron-explorer diff`.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 512, d_model: int = 128, n_heads: int = 4, n_layers: int = 2,
                 seq: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -math.inf), diagonal=1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--compile", action="store_true",
                        help='torch.compile(model, backend="neuron")')
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_model = torch.compile(model, backend="neuron") if args.compile else model

    data = torch.randint(0, 512, (8, 65))
    for _ in range(args.steps):
        batch = data.to(args.device)
        logits = step_model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
