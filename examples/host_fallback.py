"""A classifier that tracks top-5 accuracy with `torch.topk` every step.

The device has no lowering for `topk`, so it runs on the host: every step the
host waits for the logits, copies them over the host link, sorts them, and sends
the indices back, while the device sits idle. Computing the metric every N steps,
or from `argmax` (top-1, which runs on the device), keeps the step on the device.
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
    for step in range(args.steps):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        top5 = torch.topk(logits.detach(), 5, dim=-1).indices  # no device lowering: runs on the host
        hits = (top5 == y[:, None]).any(dim=-1).float().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}, top-5 accuracy {hits.item():.3f}")


if __name__ == "__main__":
    main()
