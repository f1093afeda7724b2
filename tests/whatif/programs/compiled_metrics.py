"""A compiled model and loss whose step also computes metrics on the model's outputs:
`compiled_metrics.py [--inside] [--width W] [--batch B]` (width 512 and batch 2048 unless
given: a run its device paces). By default the compiled function returns the logits with
their gradient tracked, and the metrics (accuracy, confidence) run eagerly on them;
`--inside`: the metrics computed inside the compiled function, returned detached."""

import sys

import torch
from torch import nn
from torch.nn import functional as F

INSIDE = "--inside" in sys.argv


def _option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


WIDTH, BATCH, CLASSES = _option("--width", 512), _option("--batch", 2048), 1024
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, CLASSES)).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def metrics(logits, y):
    logits = logits.detach()
    return (logits.argmax(-1) == y).float().mean(), logits.softmax(-1).amax(-1).mean()


def forward(x, y):
    logits = model(x)
    return F.cross_entropy(logits, y), logits


def forward_with_metrics(x, y):
    loss, logits = forward(x, y)
    return loss, metrics(logits, y)


step_fn = torch.compile(forward_with_metrics if INSIDE else forward, backend="neuron")
x = torch.randn(BATCH, WIDTH, device="neuron")
y = torch.randint(0, CLASSES, (BATCH,), device="neuron")
accuracy = torch.zeros((), device="neuron")
for _ in range(8):
    if INSIDE:
        loss, (acc, conf) = step_fn(x, y)
    else:
        loss, logits = step_fn(x, y)
        acc, conf = metrics(logits, y)
    accuracy += acc
    opt.zero_grad()
    loss.backward()
    opt.step()
print("accuracy", (accuracy / 8).item())
