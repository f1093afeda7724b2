"""A CNN with batch norm and dropout serving requests: `cnn_serve.py [--eval]
[--float64 | --float64-on-host]`; without `--eval` the model is left in training mode and
grad mode on (model.eval() and torch.inference_mode() forgotten). `--float64`: each
request's images come from NumPy (float64), are uploaded and converted on the device;
`--float64-on-host`: converted on the host before the upload; `--compile`: the model
compiled."""

import sys

import neuron_explorer
import numpy as np
import torch
from torch import nn


def block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


torch.manual_seed(0)
model = nn.Sequential(block(3, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Dropout(0.2), nn.Linear(64, 10)).to("neuron")
if "--eval" in sys.argv:
    model.eval()
    torch.set_grad_enabled(False)
forward = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
labels = []
for _ in range(8):
    if "--float64" in sys.argv:
        images = torch.from_numpy(np.random.rand(4, 3, 32, 32)).to("neuron").float()
    elif "--float64-on-host" in sys.argv:
        images = torch.from_numpy(np.random.rand(4, 3, 32, 32)).float().to("neuron")
    else:
        images = torch.rand(4, 3, 32, 32).to("neuron")
    labels.append(forward(images).argmax(-1).cpu().tolist())
    neuron_explorer.step()
print(labels[-1])
