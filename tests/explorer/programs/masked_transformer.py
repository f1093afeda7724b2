"""A small nn.Transformer trained eagerly with a causal mask for its target: torch checks
that the mask is causal by reading it on the host, once a call, unless told
(`--causal`: tgt_is_causal=True)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Transformer(64, 4, 1, 1, 128, dropout=0.0, batch_first=True).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
src, tgt = torch.randn(4, 8, 64).to("neuron"), torch.randn(4, 8, 64).to("neuron")
mask = nn.Transformer.generate_square_subsequent_mask(8).to("neuron")
for _ in range(4):
    out = model(src, tgt, tgt_mask=mask, tgt_is_causal=True if "--causal" in sys.argv else None)
    loss = out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
