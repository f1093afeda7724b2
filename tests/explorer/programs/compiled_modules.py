"""Ten modules of different depths, each compiled apart, trained as one stack:

    compiled_modules.py [--limit N]  # torch._dynamo.config.recompile_limit = N first

torch.compile(module) calls every module through one function, so the ten share its
recompile limit (8 by default): the last two run uncompiled unless the limit is raised."""

import sys

import torch
from torch import nn

if "--limit" in sys.argv:
    torch._dynamo.config.recompile_limit = int(sys.argv[sys.argv.index("--limit") + 1])
torch.manual_seed(0)
blocks = [nn.Sequential(*[nn.Linear(32, 32) for _ in range(depth)]).to("neuron")
          for depth in range(1, 11)]
compiled = [torch.compile(b, backend="neuron") for b in blocks]
opt = torch.optim.SGD([p for b in blocks for p in b.parameters()], lr=1e-3)
x = torch.randn(16, 32).to("neuron")
for _ in range(5):
    h = x
    for block in compiled:
        h = torch.tanh(block(h))
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
