"""A tabular model whose width (130 features) is just past a multiple of 128.

The Tensor Engine is a 128x128 systolic array with the contraction dimension on
its 128 partitions and the weight columns across it: a 130-wide layer needs two
passes in each direction for 2 extra rows and columns, so about three quarters of
the array's work is padding. A width of 128 (or 256) costs no more time per pass
and uses the whole array.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--width", type=int, default=130)
    args = parser.parse_args()

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 1)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(65536, args.width).to(args.device)
    y = torch.randn(65536, 1).to(args.device)
    for _ in range(args.steps):
        with torch.autocast("neuron", dtype=torch.bfloat16, enabled=args.device == "neuron"):
            loss = nn.functional.mse_loss(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
