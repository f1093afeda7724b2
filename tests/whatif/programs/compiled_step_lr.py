"""A training step compiled whole (loss, backward, AdamW's step) under a cosine learning-rate
schedule: `compiled_step_lr.py [--tensor-lr] [--one-cycle [--no-cycle-momentum]]`. The
scheduler changes the optimizer's learning rate, a Python float, every step: the compiled
optimizer step is compiled again for each value until Dynamo's recompile limit (8), then
runs uncompiled. `--tensor-lr`: the learning rate a tensor, which the compiled step reads
(one graph for every value). `--one-cycle`: OneCycleLR instead, which also cycles Adam's
`betas[0]` (a float) unless `--no-cycle-momentum`."""

import sys

import neuron_explorer
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("neuron")
lr = torch.tensor(1e-3) if "--tensor-lr" in sys.argv else 1e-3
opt = torch.optim.AdamW(model.parameters(), lr=lr)
if "--one-cycle" in sys.argv:
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=3e-3, total_steps=100, cycle_momentum="--no-cycle-momentum" not in sys.argv)
else:
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
x = torch.randn(32, 64, device="neuron")
y = torch.randint(0, 10, (32,), device="neuron")


@torch.compile(backend="neuron")
def train_step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


for _ in range(12):
    loss = train_step(x, y)
    schedule.step()
    neuron_explorer.step()  # one compiled call holds the optimizer step: mark the steps
print(loss.item())
