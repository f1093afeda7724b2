"""Bags of category ids embedded and averaged, then a linear layer, trained eagerly:
`embedding_bag.py [--dense]` (`nn.EmbeddingBag`, whose backward has no device lowering and
falls back to the host; `--dense`: `nn.Embedding` and a mean over the bag instead, which
the device runs)."""

import sys

import torch
from torch import nn

DENSE = "--dense" in sys.argv
torch.manual_seed(0)
embed = nn.Embedding(64, 32) if DENSE else nn.EmbeddingBag(64, 32)
head = nn.Linear(32, 4)
model = nn.ModuleDict({"embed": embed, "head": head}).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
ids = torch.randint(0, 64, (128, 4)).to("neuron")
for _ in range(10):
    bags = embed(ids).mean(1) if DENSE else embed(ids)
    loss = head(bags).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
