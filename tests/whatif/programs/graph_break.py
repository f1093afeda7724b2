"""A compiled MLP whose forward reads a value on the host mid-way, `.item()`: a graph break
and a sync every call. `graph_break.py [--fixed] [--print]` (`--fixed`: the same math on
the device, one graph; `--print`: the value printed instead, a debugging print left in,
whose float fails its guard every call until Dynamo leaves the code after it eager;
`--print --fixed`: the print removed; `--compile-loss`: a function computing the model's
loss compiled instead of the model, which hides the model's calls from module hooks)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

FIXED = "--fixed" in sys.argv
PRINT = "--print" in sys.argv


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.head = nn.Linear(64, 128), nn.Linear(128, 128), \
            nn.Linear(128, 8)

    def forward(self, x):
        h = F.gelu(self.first(x))
        if PRINT:
            if not FIXED:
                print(f"mean {h.abs().mean().item():.4f}")
        else:
            scale = h.abs().mean() if FIXED else h.abs().mean().item()  # .item(): the break
            h = h / (scale + 1.0)
        return self.head(F.gelu(self.second(h)))


torch.manual_seed(0)
model = Model().to("neuron")
compiled = torch.compile(model, backend="neuron")


@torch.compile(backend="neuron")
def model_loss(x, y):
    return F.mse_loss(model(x), y)


opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 64, device="neuron"), torch.randn(32, 8, device="neuron")
for _ in range(10):
    loss = model_loss(x, y) if "--compile-loss" in sys.argv else F.mse_loss(compiled(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
