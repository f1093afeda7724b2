"""A classifier serving 16 queued requests of one row each, `--per-call N` of them in each
call of the model (1 unless given): its rows stacked, the answers read once a call.
`--width W --rows R`: layers W wide (512) and requests of R rows (1): a large model whose
calls keep the device busy. `--compile`: the model compiled.

    python served_classifier.py [--per-call N] [--width W --rows R] [--compile]
"""

import sys

import neuron_explorer
import torch
from torch import nn


def _option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


PER_CALL, WIDTH, ROWS = _option("--per-call", 1), _option("--width", 512), _option("--rows", 1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                      nn.Linear(WIDTH, 10)).to("neuron").eval()
if "--compile" in sys.argv:
    model = torch.compile(model, backend="neuron")
requests = [torch.randn(ROWS, 256) for _ in range(16)]  # queued on the host
answers: list[int] = []
with torch.no_grad():
    for first in range(0, len(requests), PER_CALL):
        ids = list(range(first, first + PER_CALL))
        with neuron_explorer.request(ids):
            logits = model(torch.cat(requests[first:first + PER_CALL]).to("neuron"))
            answers += logits.argmax(-1).tolist()
print(answers)
