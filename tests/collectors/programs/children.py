"""Starts a forked child and a fresh Python child (as torchrun would: RANK set), each
doing device work."""

import multiprocessing as mp
import os
import subprocess
import sys

import torch

CHILD_CODE = ("import torch; x = torch.ones(8, 8, device='neuron'); "
              "print('child', (x @ x).sum().item())")


def work() -> None:
    x = torch.ones(8, 8, device="neuron")
    print("fork child", (x @ x).sum().item(), flush=True)


if __name__ == "__main__":
    x = torch.ones(4, 4, device="neuron")
    print("parent", (x + x).sum().item(), flush=True)
    p = mp.get_context("fork").Process(target=work)
    p.start()
    p.join()
    subprocess.run([sys.executable, "-c", CHILD_CODE], check=True, env={**os.environ, "RANK": "1"})
    sys.exit(p.exitcode)
