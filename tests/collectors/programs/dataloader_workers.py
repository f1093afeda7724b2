"""A training loop fed by a DataLoader with two worker processes, used by the record tests.

    python dataloader_workers.py STEPS [fork|spawn] [die|raise|persistent]
    (die: a worker dies at sample 13; raise: its __getitem__ raises there; persistent:
    persistent workers, the loader kept to the end as a script's global is: Python's exit
    ends them, without letting them finish)

A worker that dies does so once the loop has finished its first step (it waits for the
file FIRST_STEP_DONE): how the machine schedules the processes does not change what the
trace holds. Dying at once, it raced the loop by a few milliseconds: where the loop was
slower to take batch 0, torch's error came before any batch was received.
"""

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FIRST_STEP_DONE = "first-step.done"
KEPT: list = []
DIE_WAIT_S = 60


class SlowDataset(Dataset):
    """Each sample takes a millisecond to fetch: the workers' time shows on their tracks."""

    def __init__(self, size: int, die_at: int | None = None, raise_at: int | None = None
                 ) -> None:
        self.size = size
        self.die_at = die_at
        self.raise_at = raise_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        time.sleep(0.001)
        if i == self.raise_at:
            raise ValueError(f"sample {i} is corrupt")
        if i == self.die_at:
            deadline = time.monotonic() + DIE_WAIT_S
            while not os.path.exists(FIRST_STEP_DONE) and time.monotonic() < deadline:
                time.sleep(0.001)
            os._exit(1)  # the worker dies as if killed: no cleanup, no last words
        return torch.full((16,), float(i)), torch.zeros(4)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    method = sys.argv[2] if len(sys.argv) > 2 else "fork"
    die_at = 13 if sys.argv[3:] == ["die"] else None
    raise_at = 13 if sys.argv[3:] == ["raise"] else None
    persistent = sys.argv[3:] == ["persistent"]
    print("pid", os.getpid(), flush=True)  # the recording's: its workers' log folder is named so
    if os.path.exists(FIRST_STEP_DONE):
        os.remove(FIRST_STEP_DONE)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowDataset(4 * steps, die_at, raise_at), batch_size=4, num_workers=2,
                        multiprocessing_context=method, persistent_workers=persistent)
    if persistent:
        KEPT.append(loader)  # the workers live until the interpreter exits
    for step, (x, y) in enumerate(loader):
        x, y = x.to("neuron"), y.to("neuron")
        loss = (model(x) - y).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print("step", step, "first sample", int(x[0, 0].item()), flush=True)
        if step == 0 and die_at is not None:
            open(FIRST_STEP_DONE, "w").close()


if __name__ == "__main__":  # spawned workers import this file again
    main()
