"""A classifier that tracks how well-conditioned its head's features are with
`torch.linalg.svdvals` every step.

The device has no lowering for a singular value decomposition, so it runs on the
host: every step the host waits for the features, copies them over the host link,
decomposes them, and sends the singular values back, while the device sits idle.
Computing the metric every N steps, or a proxy such as the features' norms (which run
on the device), keeps the step on the device.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()

    torch.manual_seed(0)
    classes = 8192
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, classes)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1024, 512).to(args.device)
    y = torch.randint(0, classes, (1024,)).to(args.device)
    for _ in range(args.steps):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        features = model[1](model[0](x[:256])).detach()
        singular = torch.linalg.svdvals(features)  # no device lowering: runs on the host
        condition = singular[0] / singular[-1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}, feature condition number {condition.item():.1f}")


if __name__ == "__main__":
    main()
