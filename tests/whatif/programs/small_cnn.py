"""A small CNN trained eagerly or compiled: `small_cnn.py [--compile]`."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(64 * 8 * 8, 10)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
fwd = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
images = torch.rand(16, 3, 32, 32, device="neuron")
labels = torch.randint(0, 10, (16,), device="neuron")
for _ in range(10):
    loss = nn.functional.cross_entropy(fwd(images), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
