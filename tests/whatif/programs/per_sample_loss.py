"""An MLP whose loss loops over the batch's samples in Python, reading each target on the
host to index with it: `per_sample_loss.py [--vectorised] [--positions | --recurrent]`
(`--vectorised`: the same loss over the whole batch, with gather; `--positions`: a loss
summed over the 24 positions of a sequence, `logits[:, t]` each, or with `--vectorised`
over all at once; `--recurrent`: a hand-written recurrence over 24 positions, each reading
the state the one before made, which no whole-tensor op replaces; `--model-per-sample`:
the model called on one sample at a time, or with `--vectorised` on the batch;
`--accuracy`: a plain loss, and after each optimizer step the batch's accuracy counted
sample by sample on the device, `pred[i] == y[i]`, or with `--vectorised` at once;
`--compile`: with `--accuracy`, the model compiled)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

VECTORISED = "--vectorised" in sys.argv
POSITIONS = "--positions" in sys.argv
RECURRENT = "--recurrent" in sys.argv
MODEL_PER_SAMPLE = "--model-per-sample" in sys.argv
ACCURACY = "--accuracy" in sys.argv
COMPILE = "--compile" in sys.argv


def focal_loss(logits, target, weight, gamma=2.0):
    if VECTORISED:
        logp = F.log_softmax(logits, dim=-1).gather(1, target[:, None]).squeeze(1)
        return (weight * (1 - logp.exp()) ** gamma * (-logp)).mean()
    total = 0.0
    for i in range(logits.shape[0]):
        logp = F.log_softmax(logits[i], dim=-1)[target[i]]
        total = total + weight[i] * (1 - logp.exp()) ** gamma * (-logp)
    return total / logits.shape[0]


def position_loss(logits, target):
    if VECTORISED:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    total = 0.0
    for t in range(logits.shape[1]):
        total = total + F.cross_entropy(logits[:, t], target[:, t])
    return total / logits.shape[1]


def recurrence(x, step_in, step_state):
    h = torch.zeros(x.shape[0], step_state.out_features, device=x.device)
    for t in range(x.shape[1]):
        h = torch.tanh(step_in(x[:, t]) + step_state(h))
    return h


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16)).to("neuron")
state = nn.Linear(16, 16, bias=False).to("neuron")
opt = torch.optim.SGD([*model.parameters(), *state.parameters()], lr=1e-3)
forward = torch.compile(model, backend="neuron") if COMPILE else model
x, y = torch.randn(24, 64, device="neuron"), torch.randint(0, 16, (24,), device="neuron")
w = torch.rand(24, device="neuron")
seq = torch.randn(4, 24, 64, device="neuron")
seq_y = torch.randint(0, 16, (4, 24), device="neuron")
correct = torch.zeros((), device="neuron")
for _ in range(4):
    opt.zero_grad()
    if ACCURACY:
        logits = forward(x)
        loss = F.cross_entropy(logits, y)
    elif POSITIONS:
        loss = position_loss(model(seq), seq_y)
    elif RECURRENT:
        loss = recurrence(seq, model, state).square().mean()
    elif MODEL_PER_SAMPLE:
        out = model(x) if VECTORISED else torch.stack([model(x[i]) for i in range(len(x))])
        loss = F.cross_entropy(out, y)
    else:
        loss = focal_loss(model(x), y, w)
    loss.backward()
    opt.step()
    if ACCURACY:
        pred = logits.detach().argmax(dim=1)
        if VECTORISED:
            correct += (pred == y).sum()
        else:
            for i in range(pred.shape[0]):
                correct += (pred[i] == y[i]).float()
print(loss.item(), correct.item())
