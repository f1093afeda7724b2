"""nn.MultiheadAttention trained under autocast (AdamW, clipping): its attention bmm runs
in float32 while the linear layers run in bfloat16.

    python mha_autocast.py [STEPS]
"""

import sys

import torch
from torch import nn
from torch.nn import functional as F


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, 64)
        self.attn = nn.MultiheadAttention(64, 2, batch_first=True)
        self.head = nn.Linear(64, 128)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.head(x)


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.manual_seed(0)
model = Model().to("neuron")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 128, (4, 33))
for _ in range(steps):
    batch = data.to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 128).float(), batch[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
print(f"final loss {loss.item():.4f}")
