"""A three-layer MLP under DistributedDataParallel, one rank per process (torchrun):
`ddp_mlp.py [--compile]` (`--compile`: DDP(torch.compile(model)), as the findings advise).
Every rank trains on the same batch for 10 steps."""

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
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(64, 256, device=device)
y = torch.randint(0, 10, (64,), device=device)
for _ in range(10):
    loss = F.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
