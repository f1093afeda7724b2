"""An MLP whose loss loops over the batch's samples in Python, reading each target on the
host to index with it: `per_sample_loss.py [--vectorised]` (`--vectorised`: the same loss
over the whole batch, with gather)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

VECTORISED = "--vectorised" in sys.argv


def focal_loss(logits, target, weight, gamma=2.0):
    if VECTORISED:
        logp = F.log_softmax(logits, dim=-1).gather(1, target[:, None]).squeeze(1)
        return (weight * (1 - logp.exp()) ** gamma * (-logp)).mean()
    total = 0.0
    for i in range(logits.shape[0]):
        logp = F.log_softmax(logits[i], dim=-1)[target[i]]
        total = total + weight[i] * (1 - logp.exp()) ** gamma * (-logp)
    return total / logits.shape[0]


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(24, 64, device="neuron"), torch.randint(0, 16, (24,), device="neuron")
w = torch.rand(24, device="neuron")
for _ in range(4):
    opt.zero_grad()
    loss = focal_loss(model(x), y, w)
    loss.backward()
    opt.step()
print(loss.item())
