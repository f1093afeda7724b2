"""A tiny DDP run for the recording tests: 3 steps of a small MLP on each rank.

`--die-at STEP` makes the last rank SIGKILL itself at that step; `--raise-at STEP` makes
it raise an error there. `--layers N` puts N more 32-wide layers in the middle, and
`--bucket-cap-mb MB` sets DDP's bucket size (small: a bucket, and an all-reduce, a layer)."""

import argparse
import os
import signal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--die-at", type=int, default=-1)
parser.add_argument("--raise-at", type=int, default=-1)
parser.add_argument("--layers", type=int, default=0)
parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
args = parser.parse_args()
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
torch.manual_seed(0)
middle = [m for _ in range(args.layers) for m in (nn.Linear(32, 32), nn.ReLU())]
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), *middle,
                                              nn.Linear(32, 4)).to(device),
                                bucket_cap_mb=args.bucket_cap_mb)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    if step == args.die_at and rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == args.raise_at and rank == world - 1:
        raise ValueError(f"no data for step {step}")
    x = torch.randn(8, 16).to(device)
    loss = F.mse_loss(model(x), torch.zeros(8, 4, device=device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loss.item()
dist.destroy_process_group()
