"""A training loop whose two DataLoader workers are slower than its steps, used by the
record tests: each sample takes 10 ms to fetch (a sleep), a batch of 4 takes 40 ms, so two
workers hand over a batch every 20 ms at best, while the step's own host time is a few
milliseconds: its matmuls take the device's emulation far longer on this host, time the
host clock leaves out and the workers keep running in.

    python dataloader_pace.py STEPS
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = 0.010
MATMULS_PER_STEP = 3


class SleepyDataset(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        time.sleep(SAMPLE_S)
        return torch.full((16,), float(i))


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    w = torch.randn(1024, 1024, device="neuron") / 32
    loader = DataLoader(SleepyDataset(), batch_size=4, num_workers=2, persistent_workers=True)
    for step, x in enumerate(loader):
        if step == steps:
            break
        y = x.to("neuron").repeat(256, 64)
        for _ in range(MATMULS_PER_STEP):
            y = y @ w
        print("step", step, float(y.abs().sum().item()) >= 0, flush=True)


if __name__ == "__main__":
    main()
