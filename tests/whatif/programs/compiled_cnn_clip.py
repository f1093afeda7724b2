"""A compiled CNN trained with a DataLoader, gradient clipping and SGD with momentum, the
loss, the clipping and the optimizer's step left eager beside the model's graphs:
`compiled_cnn_clip.py [--split]`. `--split`: the model compiled with its loss, and the
clipping with the optimizer's step as a function of its own (a list of the parameters
for `clip_grad_norm_`: a generator breaks the graph), as host_bound advises."""

import sys

import neuron_explorer
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SPLIT = "--split" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
params = list(model.parameters())
data = TensorDataset(torch.rand(8 * 128, 3, 32, 32), torch.randint(0, 10, (8 * 128,)))
loader = DataLoader(data, batch_size=128)
fwd = torch.compile(model, backend="neuron")
loss_fn = torch.compile(lambda x, y: nn.functional.cross_entropy(model(x), y), backend="neuron")


@torch.compile(backend="neuron")
def clip_and_step():
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


for x, y in loader:
    x, y = x.to("neuron"), y.to("neuron")
    if SPLIT:
        loss = loss_fn(x, y)
        opt.zero_grad()
        loss.backward()
        clip_and_step()
    else:
        loss = nn.functional.cross_entropy(fwd(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    neuron_explorer.step()
print(float(loss))
