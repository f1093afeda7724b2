"""A small training loop on the neuron device, used by the record tests.

    python train_small.py STEPS [raise|exit3|loop]
"""

import sys

import neuron_explorer
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
mode = sys.argv[2] if len(sys.argv) > 2 else ""
print("argv", sys.argv[1:], "main", __name__)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 4)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 4))
loader = DataLoader(data, batch_size=8)


@neuron_explorer.annotate("loss_fn")
def loss_fn(out, y):
    return (out - y).square().mean()


step = 0
while True:
    for x, y in loader:
        x, y = x.to("neuron"), y.to("neuron")
        with neuron_explorer.annotate("forward_backward"):
            loss = loss_fn(model(x), y)
            loss.backward()
        with torch.profiler.record_function("optimizer_phase"):
            opt.step()
        opt.zero_grad()
        print("step", step, "loss", round(loss.item(), 4), flush=True)
        step += 1
        if mode == "raise" and step == 2:
            raise ValueError("boom at step 2")
        if mode == "exit3" and step == 2:
            sys.exit(3)
        if mode == "loop" and step == 2:
            print("READY", flush=True)
        if mode != "loop" and step >= steps:
            break
    if mode != "loop":
        break
