"""A compiled block called once per decode position with that position as a Python int,
compiled with dynamic=False: Dynamo guards on the int's value, so each new position
compiles again, until its recompile limit; then the block runs uncompiled.

    python int_guard.py                   # a compile per position, then uncompiled
    python int_guard.py --start-tensor    # the position passed as a tensor: one graph
    python int_guard.py --dynamic-default # dynamic left to Dynamo: the int turns dynamic
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int = 128, max_len: int = 64) -> None:
        super().__init__()
        self.pos = nn.Embedding(max_len, d)
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        pos = start + torch.arange(x.shape[1], device=x.device)
        h = x + self.pos(pos)
        return h + self.ff(self.norm(h))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=14)
    fix = parser.add_mutually_exclusive_group()
    fix.add_argument("--start-tensor", action="store_true")
    fix.add_argument("--dynamic-default", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    block = Block().to("neuron").eval()
    step = torch.compile(block, backend="neuron",
                         dynamic=None if args.dynamic_default else False)
    x = torch.randn(2, 1, 128).to("neuron")
    with torch.no_grad():
        for i in range(args.calls):
            start = torch.tensor(16 + i, device="neuron") if args.start_tensor else 16 + i
            x = step(x, start)
            print(f"call {i}: {x.norm().item():.4f}")


if __name__ == "__main__":
    main()
