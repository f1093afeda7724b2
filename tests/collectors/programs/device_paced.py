"""A training loop whose device work outlasts its host's, used by the record tests.

    python device_paced.py [sync]

With `sync`, the loop waits for the device after each optimizer step, as device-agnostic
timing code does (`torch.accelerator.synchronize()`).
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to("neuron")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(128, 256, device="neuron")
y = torch.randint(0, 10, (128,), device="neuron")
for _ in range(4):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if sys.argv[1:] == ["sync"]:
        torch.accelerator.synchronize()
