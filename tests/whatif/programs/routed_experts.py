"""A mixture-of-experts layer trained eagerly or compiled: a top-2 gate, and per expert the
tokens routed to it picked with `nonzero` (a size that depends on the data), gathered,
run through the expert and added back. `routed_experts.py [--compile]
[--capture-dynamic]` (`--capture-dynamic`: `torch._dynamo.config.
capture_dynamic_output_shape_ops = True`, so Dynamo compiles `nonzero` instead of breaking
the graph there)."""

import sys

import torch
import torch._dynamo
from torch import nn
from torch.nn import functional as F

if "--capture-dynamic" in sys.argv:
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
TOKENS, WIDTH, EXPERTS, TOP = 256, 64, 4, 2
torch.manual_seed(0)


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.up = nn.Parameter(torch.randn(EXPERTS, WIDTH, 2 * WIDTH) * WIDTH ** -0.5)
        self.down = nn.Parameter(torch.randn(EXPERTS, 2 * WIDTH, WIDTH) * WIDTH ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = F.softmax(self.gate(x), dim=-1).topk(TOP, dim=-1)
        chosen, weights = chosen.reshape(-1), weights.reshape(-1)
        token = torch.arange(x.shape[0], device=x.device).repeat_interleave(TOP)
        out = torch.zeros_like(x)
        for e in range(EXPERTS):
            picked = (chosen == e).nonzero().squeeze(-1)
            rows = token.index_select(0, picked)
            y = (x.index_select(0, rows) @ self.up[e]).relu() @ self.down[e]
            out.index_add_(0, rows, y * weights.index_select(0, picked).unsqueeze(-1))
        return out


model = nn.Sequential(nn.Linear(WIDTH, WIDTH), Experts(), nn.Linear(WIDTH, WIDTH)).to("neuron")
forward = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
x = torch.randn(TOKENS, WIDTH).to("neuron")
target = torch.randn(TOKENS, WIDTH).to("neuron")
for _ in range(8):
    loss = F.mse_loss(forward(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
