"""Two ranks under DistributedDataParallel over a compiled MLP, reading the loss every step,
the last rank given a larger batch than the others (a sharding that splits the data
unevenly): `ddp_uneven.py [--last-batch N]` (128, the others' batch, unless given).
Fused AdamW; 8 steps; one process per rank (torchrun)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group()
rank, last = dist.get_rank(), dist.get_world_size() - 1
local = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device("neuron", local if local < torch.neuron.device_count() else 0)
torch.neuron.set_device(device)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, 10)).to(device)
ddp = DistributedDataParallel(torch.compile(model, backend="neuron"))
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, fused=True)
batch = int(sys.argv[sys.argv.index("--last-batch") + 1]) \
    if "--last-batch" in sys.argv and rank == last else 128
data = torch.Generator().manual_seed(100 + rank)
for _ in range(8):
    x = torch.randn(batch, 1024, generator=data).to(device)
    y = torch.randint(0, 10, (batch,), generator=data).to(device)
    loss = F.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
dist.destroy_process_group()
