"""A small model whose loss is compiled with it and whose optimizer is fused, and whose host
still sets the step: nothing is left to compile, and the loss is read every step.

    compiled_host_bound.py [--whole-bf16]  # the model and its inputs cast to bfloat16"""

import sys

import torch
from torch import nn

WHOLE = "--whole-bf16" in sys.argv
dtype = torch.bfloat16 if WHOLE else torch.float32
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                      nn.Linear(1024, 512)).to("neuron", dtype)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


@torch.compile(backend="neuron")
def compute_loss(x: torch.Tensor) -> torch.Tensor:
    return (model(x) - 1).pow(2).mean()


x = torch.randn(128, 512).to("neuron", dtype)
for _ in range(8):
    loss = compute_loss(x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(loss.item())  # read every step
