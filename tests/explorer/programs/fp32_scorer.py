"""An MLP scorer served in batches of requests, kept in float32 (`--bf16`: the model and its
inputs cast to bfloat16 whole; `--autocast`: its forward under torch.autocast; `--encoder`:
a TransformerEncoder instead, which PyTorch's fast path runs a layer an op at inference):
`fp32_scorer.py [--bf16 | --autocast] [--encoder] [--width W] [--batch B]`."""

import sys

import neuron_explorer
import torch
from torch import nn


def _option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


WIDTH, BATCH, REQUESTS = _option("--width", 1024), _option("--batch", 512), 8
DTYPE = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
torch.manual_seed(0)
if "--encoder" in sys.argv:  # sequences of 64 tokens, the batch's rows
    layer = nn.TransformerEncoderLayer(WIDTH, 8, 4 * WIDTH, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Linear(WIDTH, 16)).to("neuron", DTYPE).eval()
    shape: tuple[int, ...] = (BATCH, 64, WIDTH)
else:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH),
                          nn.GELU(), nn.Linear(WIDTH, 16)).to("neuron", DTYPE).eval()
    shape = (BATCH, WIDTH)
batches = [torch.randn(*shape, device="neuron", dtype=DTYPE) for _ in range(REQUESTS)]
scores = []
with torch.inference_mode(), torch.autocast("neuron", dtype=torch.bfloat16,
                                            enabled="--autocast" in sys.argv):
    for i, x in enumerate(batches):
        with neuron_explorer.request(list(range(i * BATCH, (i + 1) * BATCH))):
            scores.append(model(x).argmax(-1))
print(torch.cat(scores).cpu().shape)
