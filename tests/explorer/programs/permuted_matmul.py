"""A layer that permutes its activations before a matmul every call: `x.permute(1, 0, 2)`
then `torch.matmul`, which makes the strided view contiguous (a copy on the device in the
forward). `--fixed`: the same math in the layout the tensor has (`x @ w`, the mean over
its own time dim). `--attention`: an nn.MultiheadAttention beside it, which makes layout
copies of its own (its heads' transposes), whatever the layer does. `--cache-write`: each
call also writes the permuted input into a slice of a buffer made before the loop (as a
decoder's static KV cache does): a copy of a strided view into memory already there.

    python permuted_matmul.py [--fixed] [--compile] [--attention] [--cache-write]
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
        self.attention = nn.MultiheadAttention(D, 4, batch_first=True) \
            if "--attention" in sys.argv else None
        self.register_buffer("cache", torch.zeros(2, T, B, D))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "--cache-write" in sys.argv:
            self.cache[self.calls % 2] = x.permute(1, 0, 2)  # a write, not a layout to keep
            self.calls += 1
        if FIXED:
            out = self.head(torch.relu(x @ self.w)).mean(1)
        else:
            h = torch.matmul(x.permute(1, 0, 2), self.w)  # a copy: the view made contiguous
            out = self.head(torch.relu(h)).mean(0)
        if self.attention is None:
            return out
        return out + self.attention(x, x, x, need_weights=False)[0].mean(1)[:, :8]


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
