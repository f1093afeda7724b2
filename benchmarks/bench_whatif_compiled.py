"""`whatif --mode compiled` against compiled recordings, on the measured (load-free) host
clock: each workload is recorded eagerly and compiled, the eager recording is predicted
compiled, and the predicted step time is set against the compiled recording's. Four
kinds of workload: an MLP, a transformer trained under bf16 autocast, a conv net with
BatchNorm, and an inference loop (a transformer's forward under no_grad).

    python benchmarks/bench_whatif_compiled.py [--rounds 3] [--steps 8]

`what_if.compiled.COMPILED_CALL_HOST_NS` and its per-input part are fitted on compiled
MLPs (docs/whatif.md); these workloads check them. Prints each round's error and the
spread per workload.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

WORKLOADS = ("mlp", "gpt_autocast", "convnet", "inference")

RECORD = r'''
import sys, torch, neuron_explorer
from torch import nn
import torch.nn.functional as F
from neuron_explorer.workloads.training import make_model, token_batches, train

torch.set_num_threads(1)
path, name, compiled, steps = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])


def convnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


with neuron_explorer.record(path, level="op", quiet=True):
    if name == "mlp":
        train(make_model("mlp"), "neuron", steps, compile=compiled)
    elif name == "gpt_autocast":
        def autocast(step):
            return torch.autocast("neuron", dtype=torch.bfloat16)
        train(make_model("gpt"), "neuron", steps, compile=compiled, on_step=autocast)
    elif name == "convnet":
        model = convnet().to("neuron")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        run = torch.compile(model, backend="neuron") if compiled else model
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x = torch.randn(8, 3, 32, 32, generator=gen).to("neuron")
            y = torch.randint(0, 10, (8,), generator=gen).to("neuron")
            loss = F.cross_entropy(run(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
    else:  # inference
        model = make_model("gpt").to("neuron").eval()
        run = torch.compile(model, backend="neuron") if compiled else model
        cfg = model.cfg
        with torch.no_grad():
            for x, _ in token_batches(steps, 8, cfg.seq_len, cfg.vocab_size):
                run(x.to("neuron")).argmax(-1).cpu()
                neuron_explorer.step()
'''


def record(path: str, name: str, compiled: bool, steps: int) -> None:
    env = {**os.environ, "NEURON_EXPLORER_CACHE": "off", "OMP_NUM_THREADS": "1"}
    env.pop("NEURON_HOST_CLOCK", None)  # the measured clock, as users record
    subprocess.run([sys.executable, "-c", RECORD, path, name, "1" if compiled else "0",
                    str(steps)], env=env, check=True, timeout=900)


def one_round(folder: str, name: str, steps: int) -> tuple[float, float]:
    """(predicted, recorded) compiled step time in ns."""
    import warnings

    import neuron_explorer as ne
    from neuron_explorer.what_if.replay import predicted_step_ns

    eager, compiled = (os.path.join(folder, f"{name}_{k}.pftrace") for k in ("eager", "compiled"))
    record(eager, name, False, steps)
    record(compiled, name, True, steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = predicted_step_ns(ne.load(eager, cache=False))
        recorded = ne.load(compiled, cache=False).summary()["step_time_ns"]
    return float(predicted or 0), float(recorded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.workloads:
            errors = []
            for r in range(args.rounds):
                predicted, recorded = one_round(folder, name, args.steps)
                errors.append(predicted / recorded - 1)
                print(f"{name} round {r + 1}: predicted {predicted / 1e6:.2f} ms, compiled "
                      f"recording {recorded / 1e6:.2f} ms ({100 * errors[-1]:+.1f}%)", flush=True)
            e = 100 * np.array(errors)
            print(f"{name}: median {np.median(e):+.1f}% (range {e.min():+.1f}% to {e.max():+.1f}%)",
                  flush=True)


if __name__ == "__main__":
    main()
