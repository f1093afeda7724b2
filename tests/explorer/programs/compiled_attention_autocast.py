"""A compiled attention block under autocast, its attention matmuls kept in fp32 or not.

    python compiled_attention_autocast.py fp32|bf16 [STEPS]
"""

import sys

import torch
from torch import nn

keep_fp32 = sys.argv[1] == "fp32"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4


class Attention(nn.Module):
    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        with torch.autocast("neuron", enabled=not keep_fp32):
            scores = torch.bmm(q.float(), k.float().transpose(1, 2)) * q.shape[-1] ** -0.5
            y = torch.bmm(scores.softmax(-1), v.float())
        return self.out(y)


model = torch.compile(Attention().to("neuron"), backend="neuron")
x = torch.randn(4, 256, 128, device="neuron")
for _ in range(steps):
    with torch.no_grad(), torch.autocast("neuron", dtype=torch.bfloat16):
        model(x).sum().item()
