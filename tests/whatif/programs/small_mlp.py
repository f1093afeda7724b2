"""A small MLP trained eagerly or compiled: `small_mlp.py LAYERS [--compile] [--item]`
(`--item`: read the loss on the host every step, as a training log does)."""

import sys

import torch
from torch import nn

LAYERS = int(sys.argv[1])
COMPILE = "--compile" in sys.argv
ITEM = "--item" in sys.argv
torch.manual_seed(0)
layers: list[nn.Module] = []
for _ in range(LAYERS):
    layers += [nn.Linear(64, 64), nn.ReLU()]
model = nn.Sequential(*layers).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
fwd = torch.compile(model, backend="neuron") if COMPILE else model
x = torch.randn(32, 64).to("neuron")
losses = []
for _ in range(12):
    loss = fwd(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if ITEM:
        losses.append(loss.item())
print(loss.item())
