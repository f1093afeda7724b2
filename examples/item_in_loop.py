"""Logging the loss with `.item()` every step.

`.item()` copies the loss to the host, so the host waits for the device to finish
the whole step before it can launch the next one: the device idles during every
launch of the next step. Accumulating the loss on the device and reading it every
N steps removes the stall.
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
    model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(256, 1024).to(args.device)
    history = []
    for step in range(args.steps):
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())  # a host<->device sync every step
        if step % 5 == 0:
            print(f"step {step}: loss {history[-1]:.4f}")


if __name__ == "__main__":
    main()
