"""Residual blocks with an early exit decided on the host: `early_exit.py [--compile]
[--no-exit]`. The forward reads each block's update norm (`.item()`) inside its loop over
the blocks, a graph break inside a loop, so torch.compile runs that forward eagerly
(`--no-exit`: no exit, every block runs, nothing read)."""

import sys

import torch
from torch import nn

COMPILE = "--compile" in sys.argv
EXIT = "--no-exit" not in sys.argv
WIDTH = 64


class EarlyExit(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(blocks))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            delta = block(x)
            x = x + delta
            if EXIT and delta.norm().item() < 1e-3:  # never small here: every block runs
                break
        return self.head(x)


torch.manual_seed(0)
model = EarlyExit().to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
fwd = torch.compile(model, backend="neuron") if COMPILE else model
x = torch.randn(32, WIDTH).to("neuron")
y = torch.randint(0, 10, (32,)).to("neuron")
for _ in range(8):
    loss = nn.functional.cross_entropy(fwd(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
