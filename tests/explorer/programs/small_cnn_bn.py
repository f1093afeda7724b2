"""A small CNN with BatchNorm trained in float32: `small_cnn_bn.py [--bf16 | --whole-bf16]
[--compile]` (--bf16: the forward under bf16 autocast; --whole-bf16: the model and its
inputs cast to bfloat16 whole; --compile: the model under torch.compile)."""

import sys

import torch
from torch import nn

AMP = "--bf16" in sys.argv
WHOLE = "--whole-bf16" in sys.argv
COMPILE = "--compile" in sys.argv
C = 48
STEPS = 10 if COMPILE else 5


def block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


torch.manual_seed(0)
model = nn.Sequential(block(3, C), block(C, C), nn.MaxPool2d(2), block(C, 2 * C),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * C, 10)).to("neuron")
if WHOLE:
    model = model.to(torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
fwd = torch.compile(model, backend="neuron") if COMPILE else model
x = torch.randn(64, 3, 32, 32).to("neuron", torch.bfloat16 if WHOLE else torch.float32)
y = torch.randint(0, 10, (64,)).to("neuron")
for _ in range(STEPS):
    with torch.autocast("neuron", dtype=torch.bfloat16, enabled=AMP):
        loss = nn.functional.cross_entropy(fwd(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
