"""Printing a neuron tensor between two ops: the formatting ops are not the program's."""

import torch

x = torch.randn(600, 600, device="neuron")
for _ in range(3):
    y = x + 1
    print(y)
    z = x * 2
print(float(z.sum()))
