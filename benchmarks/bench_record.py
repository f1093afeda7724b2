"""Recording overhead on the reference workloads: recorded time / unrecorded time.

For the MLP and the transformer (`neuron_explorer.workloads`), each run trains as
many steps as the reference scripts do (`examples/mlp_eager.py` 20,
`examples/gpt.py` 10) in a fresh process and times the training loop, from starting the
recording to closing the trace, after one warm-up step in the same mode (so
one-off costs such as lowering caches and imports are left out):
- on the `neuron` device: unrecorded, `--level op`, `--level engine`
  (targets: at most 1.3x and 2x);
- on the CPU: unrecorded and under torch.profiler (CPU activities, shapes), for
  comparison with the overhead PyTorch's own profiler adds.
Ratios are against the unrecorded run measured in this same invocation.

    python benchmarks/bench_record.py [--steps N] [--repeat 5] [--models mlp,gpt] [--clock cpu]
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
import neuron_explorer
# imported before timing, as the CLI does
from neuron_explorer.collectors import session  # noqa: F401
from neuron_explorer.workloads.training import make_model, train

name, device, mode, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[5]
steps = int(sys.argv[4])
torch.autograd.set_multithreading_enabled(False)
torch.set_num_threads(1)  # steadier timings; the same for every mode


def run(model, n, path):
    if mode == "none":
        train(model, device, n)
    elif mode == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            train(model, device, n)
        prof.export_chrome_trace(path)
    else:
        with neuron_explorer.record(path, level=mode, quiet=True):
            train(model, device, n)


# one untimed step in the same mode: first-use costs (lowering caches, imports) are
# paid once per process and are not what is measured
run(make_model(name), 1, out + ".warmup")
model = make_model(name)
start, cpu_start = time.perf_counter(), time.process_time()
run(model, steps, out)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "cpu_seconds": time.process_time() - cpu_start}))
'''


STEPS = {"mlp": 20, "gpt": 10}  # the defaults of examples/mlp_eager.py and examples/gpt.py
MODES = (("neuron", "none"), ("neuron", "op"), ("neuron", "engine"), ("cpu", "none"),
         ("cpu", "torch.profiler"))


def run_once(model: str, device: str, mode: str, steps: int, folder: str, clock: str) -> float:
    """One fresh-process run, in seconds of `clock` (wall or cpu)."""
    script = os.path.join(folder, "runner.py")
    if not os.path.exists(script):
        with open(script, "w") as f:
            f.write(RUNNER)
    out = os.path.join(folder, f"{model}-{device}-{mode}.trace")
    proc = subprocess.run([sys.executable, script, model, device, mode, str(steps), out],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{model} {device} {mode} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["cpu_seconds" if clock == "cpu" else "seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run (default: the reference script's, see STEPS)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or the process's CPU time (steadier on a busy machine)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            # Rounds of every mode, best of the rounds per mode: a slow spell of the
            # machine then touches every mode alike instead of one mode's runs.
            best = dict.fromkeys(MODES, float("inf"))
            for _ in range(args.repeat):
                for device, mode in MODES:
                    steps = args.steps or STEPS[model]
                    seconds = run_once(model, device, mode, steps, folder, args.clock)
                    best[device, mode] = min(best[device, mode], seconds)
            base, cpu = best["neuron", "none"], best["cpu", "none"]
            print(f"{model} ({args.steps or STEPS[model]} steps, {args.clock} time, best of "
                  f"{args.repeat} rounds): "
                  f"neuron unrecorded {base:.3f}s | record --level op "
                  f"{best['neuron', 'op'] / base:.2f}x (target <= 1.3x) | --level engine "
                  f"{best['neuron', 'engine'] / base:.2f}x (target <= 2x) | cpu unrecorded "
                  f"{cpu:.3f}s, torch.profiler {best['cpu', 'torch.profiler'] / cpu:.2f}x")


if __name__ == "__main__":
    main()
