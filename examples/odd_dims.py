"""An MLP whose hidden sizes are not multiples of 128.

The Tensor Engine is a 128x128 systolic array with the contraction dimension on
its 128 partitions: a hidden size of 1000 leaves the last tile 104/128 full, and a
size of 130 needs two passes for 2 extra rows. Rounding hidden sizes up to a
multiple of 128 (1024, 256) costs no more time and uses the array fully.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--hidden", type=int, default=1000)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(130, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 130),
    ).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with torch.autocast("neuron", dtype=torch.bfloat16, enabled=args.device == "neuron"):
        x = torch.randn(1000, 130).to(args.device)
        for step in range(args.steps):
            loss = model(x).float().pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
