"""A small MLP trained in eager mode.

Each layer is a handful of tiny ops, so the device finishes every kernel long
before the host has launched the next one: the device sits idle, waiting on
launches (host-bound). Recording it shows launch gaps between short kernels.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10),
    ).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    inputs = torch.randn(64, 512)
    targets = torch.randint(0, 10, (64,))
    for _ in range(args.steps):
        x, y = inputs.to(args.device), targets.to(args.device)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
