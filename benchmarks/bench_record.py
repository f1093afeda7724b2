"""Recording overhead on the reference workloads: recorded time / unrecorded time.

For the MLP and the transformer (`neuron_explorer.workloads`), each run trains a
few steps in a fresh process and times the training loop (plus closing the trace):
- on the `neuron` device: unrecorded, `--level op`, `--level engine`
  (targets: at most 1.3x and 2x);
- on the CPU: unrecorded and under torch.profiler (CPU activities, shapes), for
  comparison with the overhead PyTorch's own profiler adds.
Ratios are against the unrecorded run measured in this same invocation.

    python benchmarks/bench_record.py [--steps 6] [--repeat 3] [--models mlp,gpt]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

RUNNER = r'''
import json, sys, time
import torch
from neuron_explorer.workloads.training import make_model, train

name, device, mode, steps, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
torch.autograd.set_multithreading_enabled(False)
# one untimed step: lowering caches and first-use costs are not what is measured
train(make_model(name), device, 1)
model = make_model(name)
start = time.perf_counter()
if mode == "none":
    train(model, device, steps)
elif mode == "torch.profiler":
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        train(model, device, steps)
    prof.export_chrome_trace(out)
else:
    import neuron_explorer
    with neuron_explorer.record(out, level=mode, quiet=True):
        train(model, device, steps)
print(json.dumps({"seconds": time.perf_counter() - start}))
'''


def measure(model: str, device: str, mode: str, steps: int, repeat: int, folder: str) -> float:
    """Best of `repeat` fresh-process runs, in seconds."""
    script = os.path.join(folder, "runner.py")
    with open(script, "w") as f:
        f.write(RUNNER)
    best = float("inf")
    for i in range(repeat):
        out = os.path.join(folder, f"{model}-{device}-{mode}-{i}.trace")
        proc = subprocess.run([sys.executable, script, model, device, mode, str(steps), out],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{model} {device} {mode} failed:\n{proc.stderr[-3000:]}")
        best = min(best, json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", default="mlp,gpt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            base = measure(model, "neuron", "none", args.steps, args.repeat, folder)
            op = measure(model, "neuron", "op", args.steps, args.repeat, folder)
            engine = measure(model, "neuron", "engine", args.steps, args.repeat, folder)
            cpu = measure(model, "cpu", "none", args.steps, args.repeat, folder)
            prof = measure(model, "cpu", "torch.profiler", args.steps, args.repeat, folder)
            print(f"{model}: neuron unrecorded {base:.3f}s | record --level op {op / base:.2f}x "
                  f"(target <= 1.3x) | --level engine {engine / base:.2f}x (target <= 2x) | "
                  f"cpu unrecorded {cpu:.3f}s, torch.profiler {prof / cpu:.2f}x")


if __name__ == "__main__":
    main()
