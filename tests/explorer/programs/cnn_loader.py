"""A small CNN trained from a DataLoader (SGD), as a user would write it.

    python cnn_loader.py [STEPS]
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).to("neuron")
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = TensorDataset(torch.randn(16 * steps, 3, 16, 16), torch.randint(0, 10, (16 * steps,)))
loader = DataLoader(data, batch_size=16)
for images, labels in loader:
    images, labels = images.to("neuron"), labels.to("neuron")
    loss = nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
