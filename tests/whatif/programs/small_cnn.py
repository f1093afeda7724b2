"""A small CNN trained eagerly or compiled:
`small_cnn.py [--compile] [--batch N] [--size PIXELS] [--steps N]`."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--compile", action="store_true")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--size", type=int, default=32)  # square images, a multiple of 4
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(0)
side = args.size // 4
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(64 * side * side, 10)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
fwd = torch.compile(model, backend="neuron") if args.compile else model
images = torch.rand(args.batch, 3, args.size, args.size, device="neuron")
labels = torch.randint(0, 10, (args.batch,), device="neuron")
for _ in range(args.steps):
    loss = nn.functional.cross_entropy(fwd(images), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
