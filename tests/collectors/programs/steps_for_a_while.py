"""Steps that take a while in real time (sleeps), for the live status line."""

import sys
import time

import neuron_explorer
import torch

a = torch.ones(4, device="neuron")
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
    a = a + 1
    time.sleep(0.25)
    neuron_explorer.step()
