"""FSDP2 (`fully_shard`) on `neuron`: a small transformer sharded over 2-4 ranks.

    torchrun --nproc_per_node=2 examples/fsdp.py                 # on neuron
    torchrun --nproc_per_node=2 examples/fsdp.py --device cpu    # the same on CPU + gloo
    neuron-explorer record -- torchrun --nproc_per_node=2 examples/fsdp.py

Each block is sharded on its own: its parameters are all-gathered before its forward
and backward, and its gradients reduce-scattered after its backward, so the trace
shows one all-gather per block in forward, one more in backward, and one
reduce-scatter per block.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    """Pre-norm self-attention and MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2,
                 seq: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


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
    dist.init_process_group("gloo" if args.device == "cpu" else "cpu:gloo,neuron:neuron")
    rank = dist.get_rank()
    device = device_for(args.device)
    torch.manual_seed(0)  # the same full model on every rank before sharding
    model = TinyTransformer().to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    data = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(args.steps):
        tokens = torch.randint(0, 256, (4, 33), generator=data)
        inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
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
