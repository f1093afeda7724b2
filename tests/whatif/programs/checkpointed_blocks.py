"""Four residual MLP blocks trained eagerly, each called through torch.utils.checkpoint:
`checkpointed_blocks.py [--no-checkpoint]` (`--no-checkpoint`: the blocks called plainly,
their activations kept for the backward)."""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

CHECKPOINT = "--no-checkpoint" not in sys.argv
WIDTH = 128


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if CHECKPOINT else block(x)
        return self.head(x)


torch.manual_seed(0)
model = Net().to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, WIDTH).to("neuron")
y = torch.randint(0, 10, (64,)).to("neuron")
for _ in range(8):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
