"""Reading the loss with `.item()` every step to log it.

`.item()` copies the loss to the host, so the host waits there until the device
has finished the whole step. Everything the host does next (here: writing the
metrics) no longer overlaps with device work, and the device idles until the
next step's first launch. Keeping the loss on the device and reading it every N
steps (or logging asynchronously) removes the stall.
"""

import argparse
import io
import json

import torch
from torch import nn


def log_metrics(sink: io.StringIO, step: int, loss: float) -> None:
    """Stands for writing to a metrics service: a few ms of host work per step."""
    record = {"step": step, "loss": loss, "hist": [loss * i for i in range(5000)]}
    sink.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--sync-every", type=int, default=1,
                        help="read the loss every N steps (the fix: N > 1); log every step")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(2048, 1024).to(args.device)
    metrics = io.StringIO()
    for step in range(args.steps):
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.sync_every == 0:  # .item(): the host waits for the device here
            last_loss = loss.item()
        log_metrics(metrics, step, last_loss)
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
