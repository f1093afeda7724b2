"""A mixture-of-experts layer whose router uses `torch.topk`.

The device has no lowering for `topk`, so it runs on the host: every step the
router scores travel to the host and the result comes back, and the device waits
meanwhile. A softmax-and-threshold router (or a device-side top-1 via `argmax`)
keeps the step on the device.
"""

import argparse

import torch
from torch import nn


class MoE(nn.Module):
    def __init__(self, d_model: int = 256, n_experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.router = nn.Linear(d_model, n_experts)
        self.experts = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(n_experts))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.router(x).softmax(dim=-1)
        weights, chosen = torch.topk(scores, self.k, dim=-1)  # no device lowering: runs on the host
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            gate = (weights * (chosen == e)).sum(dim=-1, keepdim=True)
            out = out + gate * expert(x)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(MoE(), nn.ReLU(), nn.Linear(256, 256)).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(512, 256).to(args.device)
    for step in range(args.steps):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
