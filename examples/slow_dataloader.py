"""A data pipeline slower than the device.

Each batch is decoded and augmented in Python in the main process
(`num_workers=0`), so the device waits for data at the start of every step.
More workers, or moving the augmentation to the device, fixes it.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    """Synthetic 'images' with an expensive per-sample decode."""

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        time.sleep(0.0005)  # stands for JPEG decoding
        image = torch.rand(3, 32, 32, generator=g)
        image = (image - 0.5) / 0.25
        return image, i % 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--workers", type=int, default=0, help="data-loader worker processes")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 16 * 16, 10),
    ).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(SlowImages(), batch_size=32, shuffle=False, num_workers=args.workers)
    for step, (images, labels) in enumerate(loader):
        if step == args.steps:
            break
        images, labels = images.to(args.device), labels.to(args.device)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
