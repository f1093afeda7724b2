"""An IterableDataset of 24 samples split between two DataLoader workers, batches of 4,
used by the record tests: each worker yields 3 batches, then signals its end.

    python dataloader_iterable.py
"""

import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SAMPLES = 24


class Numbers(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for i in range(info.id, SAMPLES, info.num_workers):
            time.sleep(0.001)
            yield torch.full((4,), float(i))


def main() -> None:
    w = torch.ones(4, device="neuron")
    loader = DataLoader(Numbers(), batch_size=4, num_workers=2)
    for step, x in enumerate(loader):
        print("step", step, float((x.to("neuron") * w).sum().item()), flush=True)


if __name__ == "__main__":
    main()
