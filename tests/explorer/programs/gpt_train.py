"""A tiny GPT trained with AdamW, autocast, gradient clipping and a scheduler.

    python gpt_train.py [--steps N] [--compile] [--autocast]
"""

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, seq: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, 2) for _ in range(2))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--compile", action="store_true")
parser.add_argument("--autocast", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
model = GPT().to("neuron")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
run = torch.compile(model, backend="neuron") if args.compile else model
data = torch.randint(0, 128, (4, 33))
for _ in range(args.steps):
    batch = data.to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16, enabled=args.autocast):
        logits = run(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               batch[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
print(f"final loss {loss.item():.4f}")
