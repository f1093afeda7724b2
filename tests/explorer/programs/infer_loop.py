"""An inference loop over requests of varying lengths: no optimizer, no step marks.

    python infer_loop.py [REQUESTS] [--compile]
"""

import sys

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.out = nn.Linear(d, 100)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.out(x)


requests = int(sys.argv[1]) if len(sys.argv) > 1 else 5
torch.manual_seed(0)
model = Encoder().to("neuron").eval()
run = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
with torch.no_grad():
    for i in range(requests):
        idx = torch.randint(0, 100, (2, 8 + 4 * i)).to("neuron")
        logits = run(idx)
        token = logits[:, -1].argmax(-1)
print("last tokens", token.tolist())
