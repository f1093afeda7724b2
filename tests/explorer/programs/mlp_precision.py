"""An MLP with GELU and a squared-error loss trained in float32: `mlp_precision.py
[--autocast | --autocast-body | --bf16] [--width W] [--batch B]` (`--autocast`: the forward
and loss under bf16 autocast; `--autocast-body`: all but the last layer under it, the last
on the body's output made float32 again, a loss head kept in float32; `--bf16`: the model
and its data cast to bfloat16 whole)."""

import sys

import torch
from torch import nn


def _option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


WIDTH, BATCH = _option("--width", 512), _option("--batch", 512)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
model = model.to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(BATCH, WIDTH).to("neuron")
y = torch.randn(BATCH, WIDTH).to("neuron")
if "--bf16" in sys.argv:
    model, x, y = model.to(torch.bfloat16), x.to(torch.bfloat16), y.to(torch.bfloat16)
for _ in range(5):
    if "--autocast-body" in sys.argv:
        with torch.autocast("neuron", dtype=torch.bfloat16):
            body = model[1](model[0](x))
        loss = (model[2](body.float()) - y).pow(2).mean()
    else:
        with torch.autocast("neuron", dtype=torch.bfloat16, enabled="--autocast" in sys.argv):
            loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
