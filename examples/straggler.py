"""A straggler: one rank does extra host work every step, so the others wait for it.

    torchrun --nproc_per_node=2 examples/straggler.py
    neuron-explorer record -- torchrun --nproc_per_node=4 examples/straggler.py

DDP all-reduces the gradients at the end of each backward. The last rank spends
`--extra-ms` of host time preparing its batch (standing in for slow data loading or
logging on one host), so it reaches the all-reduce late: on the other ranks each
step's all-reduce waits that long (`wait_ns` on their collective slices), on the slow
rank it does not wait at all.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--extra-ms", type=float, default=20.0,
                        help="host work the slow rank adds to every step")
    return parser.parse_args()


def busy_host_work(seconds: float) -> None:
    """Host work that holds the CPU for `seconds` of its own time, as preprocessing does a
    fixed amount of work: on a busy machine it takes longer on the wall clock, not less
    work (a loop until a wall-clock time did less work the more it was preempted)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def main() -> None:
    args = parse_args()
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    index = local_rank if local_rank < torch.neuron.device_count() else 0
    torch.neuron.set_device(index)
    device = torch.device("neuron", index)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 10)).to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)
    slow = rank == world - 1
    for step in range(args.steps):
        if slow:
            busy_host_work(args.extra_ms / 1e3)
        x = torch.randn(64, 128, generator=data).to(device)
        y = torch.randint(0, 10, (64,), generator=data).to(device)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        value = loss.item()
        if rank == 0:
            print(f"step {step}: loss {value:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
