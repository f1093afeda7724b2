"""A compiled CNN whose forward checks its activations for NaN (`if torch.isnan(x).any()`: a
graph break and a sync every call), its loss and a momentum SGD eager beside the graphs:
`guarded_cnn.py [--fixed] [--drawn]` (`--fixed`: the loss computed inside the compiled
function and the optimizer fused=True, as host_bound advises; `--drawn`: each step's batch
drawn on the device, torch.randn and torch.randint, before the model runs)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

FIXED = "--fixed" in sys.argv
DRAWN = "--drawn" in sys.argv


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        if torch.isnan(x).any():  # the NaN guard: reads a device value
            print("NaN in activations")
        return self.fc(F.relu(self.c2(x)).mean((2, 3)))


torch.manual_seed(0)
net = Net().to("neuron")
model = torch.compile(net, backend="neuron")


@torch.compile(backend="neuron")
def model_loss(x, y):
    return F.cross_entropy(net(x), y)


opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, fused=True if FIXED else None)
x, y = torch.randn(32, 3, 16, 16).to("neuron"), torch.randint(0, 10, (32,)).to("neuron")
for _ in range(8):
    if DRAWN:
        x = torch.randn(32, 3, 16, 16, device="neuron")
        y = torch.randint(0, 10, (32,), device="neuron")
    loss = model_loss(x, y) if FIXED else F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
