"""Small programs the what-if tests record on one preset and predict on another.

    python workloads.py NAME OUT.pftrace LEVEL [compiled]

Run in a fresh process per recording: the hardware preset (NEURON_HARDWARE) is fixed
for a process on first use."""

from __future__ import annotations

import sys

import neuron_explorer
import torch
from torch import nn


def mlp(compiled: bool) -> None:
    from neuron_explorer.workloads.training import make_model, train

    train(make_model("mlp"), "neuron", 3, compile=compiled)


def device_bound(compiled: bool) -> None:
    """Big matmuls and a sync each step: the step time is the device's."""
    torch.manual_seed(0)
    w = torch.randn(2048, 2048, device="neuron")
    x = torch.randn(1024, 2048, device="neuron")
    for _ in range(3):
        y = x
        for _ in range(2):
            y = torch.relu(y @ w)
        y.sum().item()
        neuron_explorer.step()


def conv(compiled: bool) -> None:
    """A small conv net with layer norm and softmax: other lowerings than matmuls."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.LayerNorm(16 * 8 * 8), nn.Linear(16 * 8 * 8, 10)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3, 8, 8).to("neuron")
    y = torch.randint(0, 10, (8,)).to("neuron")
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(x).softmax(-1), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()


WORKLOADS = {"mlp": mlp, "device_bound": device_bound, "conv": conv}

if __name__ == "__main__":
    name, out, level = sys.argv[1], sys.argv[2], sys.argv[3]
    compiled = len(sys.argv) > 4 and sys.argv[4] == "compiled"
    torch.set_num_threads(1)
    with neuron_explorer.record(out, level=level, quiet=True):
        WORKLOADS[name](compiled)
