"""What-if accuracy on the reference transformer: an eager trn1 recording predicted
(a) on trn3, against a real trn3 recording, and (b) compiled, against a real trn1
recording of the model under torch.compile (the loss eager, as `--mode compiled` models
it). Prints per-kernel and step-time errors; recordings use the modelled host clock so
they are reproducible.

    python benchmarks/bench_whatif.py [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

RECORD = r'''
import sys, torch, neuron_explorer
from neuron_explorer.workloads.training import make_model, train
torch.set_num_threads(1)
with neuron_explorer.record(sys.argv[1], level="op", quiet=True):
    model = make_model("gpt")
    if sys.argv[3] == "1":  # torch.compile(model), the loss eager: what `--mode compiled` models
        model = torch.compile(model, backend="neuron")
    train(model, "neuron", int(sys.argv[2]))
'''


def record(path: str, hardware: str, steps: int, compiled: bool) -> None:
    env = {**os.environ, "NEURON_HARDWARE": hardware, "NEURON_HOST_CLOCK": "modelled"}
    subprocess.run([sys.executable, "-c", RECORD, path, str(steps), "1" if compiled else "0"],
                   env=env, check=True, timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    import neuron_explorer as ne

    with tempfile.TemporaryDirectory() as folder:
        paths = {k: os.path.join(folder, f"{k}.pftrace") for k in ("trn1", "trn3", "compiled")}
        record(paths["trn1"], "trn1", args.steps, False)
        record(paths["trn3"], "trn3", args.steps, False)
        record(paths["compiled"], "trn1", args.steps, True)
        source = ne.load(paths["trn1"])
        start = time.perf_counter()
        on_trn3 = ne.whatif(source, "trn3", output=os.path.join(folder, "p3.pftrace"))
        eager_s = time.perf_counter() - start
        real = ne.load(paths["trn3"])
        p, r = on_trn3.kernels["dur"].to_numpy(), real.kernels["dur"].to_numpy()
        err = np.abs(p - r) / r if len(p) == len(r) else np.array([np.inf])
        step_err = on_trn3.steps["dur"].to_numpy() / real.steps["dur"].to_numpy() - 1
        print(f"trn1 -> trn3 eager ({eager_s:.2f}s): {len(p)} kernels (real {len(r)}), "
              f"max kernel error {100 * err.max():.2f}%, step errors "
              f"{', '.join(f'{100 * e:+.2f}%' for e in step_err)}")
        start = time.perf_counter()
        compiled = ne.whatif(source, mode="compiled", output=os.path.join(folder, "pc.pftrace"))
        compiled_s = time.perf_counter() - start
        real_c = ne.load(paths["compiled"])
        steady = slice(1, None)  # step 0 compiles (real) / is the first (predicted)
        ps = compiled.steps["dur"].to_numpy()[steady]
        rs = real_c.steps["dur"].to_numpy()[steady]
        n = min(len(ps), len(rs))

        def busy(trace):
            k = trace.kernels
            return k[k["step"] >= 1].groupby("step")["dur"].sum().to_numpy()

        pb, rb = busy(compiled), busy(real_c)
        m = min(len(pb), len(rb))
        print(f"eager -> compiled ({compiled_s:.2f}s): steady step time predicted "
              f"{np.median(ps[:n]) / 1e3:.1f} us vs real {np.median(rs[:n]) / 1e3:.1f} us "
              f"({100 * (np.median(ps[:n]) / np.median(rs[:n]) - 1):+.1f}%); device busy per step "
              f"{np.median(pb[:m]) / 1e3:.1f} us vs {np.median(rb[:m]) / 1e3:.1f} us "
              f"({100 * (np.median(pb[:m]) / np.median(rb[:m]) - 1):+.1f}%)")


if __name__ == "__main__":
    main()
