"""An MLP trained with a hand-written focal-style loss of many small elementwise ops, beside
the model: `many_op_loss.py [--compile model|step]` (`model`: torch.compile(model), the
loss left eager; `step`: a function that runs the model and computes the loss,
compiled)."""

import sys

import torch
from torch import nn

MODE = sys.argv[sys.argv.index("--compile") + 1] if "--compile" in sys.argv else ""


def focal_loss(logits, target):
    p = logits.softmax(-1).clamp(1e-6, 1 - 1e-6)
    onehot = torch.zeros_like(p).scatter_(1, target[:, None], 1.0)
    pt = (p * onehot).sum(-1)
    weight = (1 - pt) ** 2
    smooth = onehot * 0.9 + 0.1 / p.shape[-1]
    ce = -(smooth * p.log()).sum(-1)
    penalty = (logits.abs().mean(-1) - 1).relu() * 0.01
    return (weight * ce + penalty).mean()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
forward = torch.compile(model, backend="neuron") if MODE == "model" else model


@torch.compile(backend="neuron")
def model_loss(x, y):
    return focal_loss(model(x), y)


x, y = torch.randn(32, 64).to("neuron"), torch.randint(0, 10, (32,)).to("neuron")
for _ in range(8):
    loss = model_loss(x, y) if MODE == "step" else focal_loss(forward(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
