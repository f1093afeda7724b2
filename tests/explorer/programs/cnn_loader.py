"""A small CNN trained from a DataLoader (SGD), as a user would write it.

    python cnn_loader.py [STEPS] [--slow-data]

`--slow-data` decodes each sample slowly in the main process (num_workers=0), so the
steps wait for their batches.
"""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n: int, slow: bool) -> None:
        self.x = torch.randn(n, 3, 16, 16)
        self.y = torch.randint(0, 10, (n,))
        self.slow = slow

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.slow:
            time.sleep(0.002)  # stands for JPEG decoding
        return self.x[i], self.y[i]


steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 6
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).to("neuron")
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(Images(16 * steps, "--slow-data" in sys.argv), batch_size=16)
for images, labels in loader:
    images, labels = images.to("neuron"), labels.to("neuron")
    loss = nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
