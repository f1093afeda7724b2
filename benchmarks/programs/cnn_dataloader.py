"""A small ResNet-style CNN trained from an in-process DataLoader, the loss read with
`.item()` every step: a host-bound eager loop whose batches are collated on the same
thread that launches the ops (the host clock's case of a DataLoader under machine load).

    python benchmarks/programs/cnn_dataloader.py [--steps 40] [--device neuron]
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.block1 = Block(32)
        self.down = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.block2 = Block(64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.block1(F.relu(self.bn(self.stem(x))))
        x = self.block2(F.relu(self.down(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net().to(args.device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    count = args.batch * args.steps
    data = TensorDataset(torch.randn(count, 3, 16, 16), torch.randint(0, 10, (count,)))
    for x, y in DataLoader(data, batch_size=args.batch, shuffle=True):
        x, y = x.to(args.device), y.to(args.device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()


if __name__ == "__main__":
    main()
