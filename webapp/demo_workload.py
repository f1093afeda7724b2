"""The demo's workload: the reference MLP trained in eager mode on the `neuron` device.

Eager mode launches one small kernel per op, so the device mostly waits on the host:
a host-bound trace with clear findings. Run it under `neuron-explorer record`.
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    import torch  # noqa: F401  (loads the neuron device)
    from neuron_explorer.workloads.training import make_model, train

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train-steps", type=int, default=6, help="training steps to run")
    args = parser.parse_args(argv)
    losses = train(make_model("mlp"), "neuron", steps=args.train_steps)
    print(f"trained {len(losses)} steps, final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
