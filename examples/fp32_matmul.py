"""Large matmuls left in fp32.

The Tensor Engine runs fp32 matmuls at a quarter of its bf16 rate. Wrapping the
forward pass in `torch.autocast("neuron", dtype=torch.bfloat16)` runs them in bf16
(accumulating in fp32 in PSUM) for about 4x the matmul throughput.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--bf16", action="store_true",
                        help="run the forward pass under bf16 autocast")
    parser.add_argument("--bf16-weights", action="store_true",
                        help="keep the model and its input in bf16 (no casts per step)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).to(args.device)
    x = torch.randn(512, 2048).to(args.device)
    if args.bf16_weights:
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(args.steps):
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16):
            loss = (model(x).float() - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
