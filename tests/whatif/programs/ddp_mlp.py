"""A three-layer MLP under DistributedDataParallel, one rank per process (torchrun):
`ddp_mlp.py [--compile | --compile-loss] [--accumulate K [--no-sync]] [--two-models]`
(`--compile`: DDP(torch.compile(model)), as the findings advise; `--compile-loss`: the
model and its loss one compiled module under DDP; `--fused`: SGD's step fused=True;
`--accumulate`: K micro-batches a step,
each reduced, or with `--no-sync` all but the last under `ddp.no_sync()`; `--two-models`:
a second DDP model trained beside the first, its own backward each step, as a GAN's
generator and discriminator). Every rank trains on the same batch for 10 steps."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group()
local = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device("neuron", local if local < torch.neuron.device_count() else 0)
torch.neuron.set_device(device)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10)).to(device)
if "--compile" in sys.argv:
    model = torch.compile(model, backend="neuron")


class WithLoss(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs, targets):
        return F.cross_entropy(self.net(inputs), targets)


ddp = DistributedDataParallel(torch.compile(WithLoss(model), backend="neuron")
                              if "--compile-loss" in sys.argv else model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9,
                      fused=True if "--fused" in sys.argv else None)
x = torch.randn(64, 256, device=device)
y = torch.randint(0, 10, (64,), device=device)
ACCUMULATE = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv \
    else 1
if "--two-models" in sys.argv:
    other = DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(),
                                                  nn.Linear(256, 10)).to(device))
    both = torch.optim.SGD([*ddp.parameters(), *other.parameters()], lr=0.01)
    for _ in range(10):
        both.zero_grad()
        for net in (ddp, other):
            F.cross_entropy(net(x), y).backward()
        both.step()
    dist.destroy_process_group()
    sys.exit()
for _ in range(10 if "--compile-loss" not in sys.argv else 0):
    opt.zero_grad()
    for micro in range(ACCUMULATE):
        if "--no-sync" in sys.argv and micro < ACCUMULATE - 1:
            with ddp.no_sync():
                F.cross_entropy(ddp(x), y).backward()
        else:
            F.cross_entropy(ddp(x), y).backward()
    opt.step()
for _ in range(10 if "--compile-loss" in sys.argv else 0):
    opt.zero_grad()
    ddp(x, y).backward()
    opt.step()
dist.destroy_process_group()
