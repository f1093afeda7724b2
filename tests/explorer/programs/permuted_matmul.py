"""A layer that permutes its activations before a matmul every call: `x.permute(1, 0, 2)`
then `torch.matmul`, which makes the strided view contiguous (a copy on the device in the
forward). `--fixed`: the same math in the layout the tensor has (`x @ w`, the mean over
its own time dim).

    python permuted_matmul.py [--fixed] [--compile]
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn

FIXED = "--fixed" in sys.argv
B, T, D = 16, 64, 128


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) * 0.05)
        self.head = nn.Linear(D, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if FIXED:
            return self.head(torch.relu(x @ self.w)).mean(1)
        h = torch.matmul(x.permute(1, 0, 2), self.w)  # a copy: the view made contiguous
        return self.head(torch.relu(h)).mean(0)


torch.manual_seed(0)
model = Layer().to("neuron")
run = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(B, T, D, device="neuron"), torch.randn(B, 8, device="neuron")
for _ in range(8):
    loss = F.mse_loss(run(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
