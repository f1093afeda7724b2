"""A compiled MLP regressor whose loss (mean squared plus a tenth of the absolute error)
runs eagerly on its output: `regression_loss.py [--compile-loss] [--width W] [--batch B]
[--outputs O]` (width 512, batch 2048 and 2048 outputs unless given: a run its device
paces); `--compile-loss`: the model and its loss compiled as one function."""

import sys

import torch
from torch import nn
from torch.nn import functional as F


def _option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


WIDTH, BATCH = _option("--width", 512), _option("--batch", 2048)
OUTPUTS = _option("--outputs", 2048)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.SiLU(), nn.Linear(WIDTH, OUTPUTS)).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def loss_of(out, target):
    return F.mse_loss(out, target) + 0.1 * F.l1_loss(out, target)


compiled_model = torch.compile(model, backend="neuron")
compiled_step = torch.compile(lambda x, target: loss_of(model(x), target), backend="neuron")
x = torch.randn(BATCH, WIDTH, device="neuron")
target = torch.randn(BATCH, OUTPUTS, device="neuron")
for _ in range(8):
    if "--compile-loss" in sys.argv:
        loss = compiled_step(x, target)
    else:
        loss = loss_of(compiled_model(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
