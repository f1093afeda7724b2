"""DistributedDataParallel on `neuron`: a small MLP trained on 2-4 ranks.

    torchrun --nproc_per_node=2 examples/ddp.py                 # on neuron
    torchrun --nproc_per_node=2 examples/ddp.py --device cpu    # the same on CPU + gloo
    neuron-explorer record -- torchrun --nproc_per_node=4 examples/ddp.py

Each rank draws its own batches; DDP all-reduces the gradients in buckets during
backward, so the losses match the CPU + gloo run step for step.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("neuron", "cpu"), default="neuron")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--losses", metavar="PATH", help="write rank 0's losses here (JSON)")
    return parser.parse_args()


def device_for(kind: str) -> torch.device:
    """neuron:LOCAL_RANK (neuron:0 when the chip has fewer cores than ranks), or the CPU."""
    if kind == "cpu":
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    index = local_rank if local_rank < torch.neuron.device_count() else 0
    torch.neuron.set_device(index)
    return torch.device("neuron", index)


def main() -> None:
    args = parse_args()
    # The device-aware default picks gloo for CPU tensors and the neuron backend for
    # neuron tensors ("cpu:gloo,neuron:neuron").
    dist.init_process_group("gloo" if args.device == "cpu" else None)
    rank = dist.get_rank()
    device = device_for(args.device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 16)).to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.02)  # a few buckets, to overlap
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    losses = []
    for step in range(args.steps):
        x = torch.randn(32, 64, generator=data).to(device)
        y = torch.randn(32, 16, generator=data).to(device)
        loss = F.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f}", flush=True)
    if rank == 0 and args.losses:
        with open(args.losses, "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
