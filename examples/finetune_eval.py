"""A small fine-tune that evaluates on held-out batches every few steps.

The eval pass runs forward only, under `torch.no_grad()`, between two optimizer steps.
`Trace.phases()` shows it as its own `eval` phase, and the report's per-step figures
count the training steps alone.

    python examples/finetune_eval.py [--steps 12] [--eval-every 3] [--eval-batches 4]
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=3, help="0: never evaluate")
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                          nn.Linear(512, 10)).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    inputs, targets = torch.randn(64, 256), torch.randint(0, 10, (64,))
    held_out = [(torch.randn(64, 256), torch.randint(0, 10, (64,)))
                for _ in range(args.eval_batches)]

    for step in range(args.steps):
        if args.eval_every and step and step % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                total = sum(loss_fn(model(x.to(args.device)), y.to(args.device)).item()
                            for x, y in held_out)
            model.train()
            print(f"step {step}: eval loss {total / len(held_out):.4f}")
        x, y = inputs.to(args.device), targets.to(args.device)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
