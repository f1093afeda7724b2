"""The host clock against machine load: the same script recorded on the machine as it is
and with two busy processes per core gives the same step times.

For each workload, rounds of: record it as the machine is ("idle"), then record it
again while 2 x cores busy-looping processes run (spawned here, each ending itself
after `--busy-seconds` and killed at the end of the run at the latest). The figure is
the median step time of the recorded steps after the first two (warm-up), read from
the trace; the ratio loaded/idle is reported per round, then its median and spread.
With `--wall`, the same pairs are also recorded with `NEURON_HOST_CLOCK=wall` (real
time minus emulation, the clock before the load-free one), for contrast.

Second part: what one recorded op is charged on the host (op slice + the program
time before it) in a tight loop of tiny adds, against what the same op costs in
plain torch on the CPU (best of the rounds), and the parts of the charge.

    python benchmarks/bench_host_clock.py [--rounds 3] [--workloads mlp,gpt] [--wall]

Other work on a shared machine loads both runs of a pair alike; the busy processes
come on top of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = {
    "mlp": [os.path.join(ROOT, "examples", "mlp_eager.py")],
    "gpt": [os.path.join(ROOT, "examples", "gpt.py")],
    "gpt-compiled": [os.path.join(ROOT, "examples", "gpt.py"), "--compile", "--steps", "8"],
}
BUSY = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"

TINY_OPS = r'''
import sys, time, torch
n, device = int(sys.argv[1]), sys.argv[2]
a, b = torch.ones(4, device=device), torch.ones(4, device=device)
for _ in range(200):
    torch.add(a, b)
best = float("inf")
for _ in range(5):
    start = time.thread_time_ns()
    for _ in range(n):
        torch.add(a, b)
    best = min(best, (time.thread_time_ns() - start) / n)
print(best)
'''


def start_busy(count: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)]) for _ in range(count)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def step_ms(path: str) -> float:
    import neuron_explorer

    steps = neuron_explorer.load(path).steps
    durations = steps["dur"].to_numpy()[2:] if len(steps) > 3 else steps["dur"].to_numpy()
    return float(statistics.median(durations)) / 1e6


def record(argv: list[str], out: str, clock: str) -> tuple[float, float]:
    """Record one run; (median step ms from the trace, wall seconds of the run)."""
    env = dict(os.environ, NEURON_HOST_CLOCK=clock)
    cmd = [sys.executable, "-m", "neuron_explorer", "record", "--level", "op", "-o", out,
           "--", "python", *argv]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"recording {argv} failed:\n{proc.stderr[-3000:]}")
    return step_ms(out), wall


def pair(argv: list[str], folder: str, clock: str, busy: int, busy_seconds: float) -> dict:
    idle_ms, idle_wall = record(argv, os.path.join(folder, "idle.pftrace"), clock)
    procs = start_busy(busy, busy_seconds)
    try:
        time.sleep(0.3)  # let them take the cores
        loaded_ms, loaded_wall = record(argv, os.path.join(folder, "loaded.pftrace"), clock)
    finally:
        stop_busy(procs)
    return {"idle_ms": idle_ms, "loaded_ms": loaded_ms, "ratio": loaded_ms / idle_ms,
            "wall_ratio": loaded_wall / idle_wall}


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.3f} "
            f"(min {min(values):.3f}, max {max(values):.3f}, n={len(values)})")


def op_charge(folder: str, n: int = 2000) -> None:
    """A recorded tiny op's host charge against the same op in plain torch on the CPU."""
    import neuron_explorer
    import numpy as np

    script = os.path.join(folder, "tiny_ops.py")
    with open(script, "w") as f:
        f.write(TINY_OPS)
    cpu = float(subprocess.run([sys.executable, script, str(n), "cpu"], capture_output=True,
                               text=True, check=True).stdout.split()[-1])
    out = os.path.join(folder, "tiny.pftrace")
    subprocess.run([sys.executable, "-m", "neuron_explorer", "record", "--level", "op", "-o", out,
                    "--", "python", script, str(n), "neuron"], capture_output=True, check=True)
    trace = neuron_explorer.load(out)
    ops = trace.ops
    adds = ops[ops["name"] == "aten::add"].sort_values("ts")
    ts, dur = adds["ts"].to_numpy(), adds["dur"].to_numpy()
    charge = np.median(np.diff(ts))  # one op's slice plus the program time before the next
    launch = float(np.median(dur))
    meta = trace.metadata.get("host_clock", {}) if hasattr(trace, "metadata") else {}
    print(f"one recorded torch.add on tiny tensors is charged {charge / 1e3:.1f} µs of host "
          f"time: launch path {launch / 1e3:.1f} µs (the preset's host launch overhead) + "
          f"{(charge - launch) / 1e3:.1f} µs of program and framework time (PyTorch's "
          f"binding and dispatcher as measured, + {meta.get('backend_op_ns', 0) / 1e3:.1f} µs "
          f"backend C++, our boxing of {meta.get('boxing_ns_per_op', 0) / 1e3:.1f} µs taken off); "
          f"plain torch on the CPU: {cpu / 1e3:.1f} µs per op (CPU time, best of 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="mlp,gpt", help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--busy-per-core", type=int, default=2)
    parser.add_argument("--busy-seconds", type=float, default=120.0,
                        help="each busy process ends itself after this long at the latest")
    parser.add_argument("--wall", action="store_true",
                        help="also record with NEURON_HOST_CLOCK=wall, for contrast")
    parser.add_argument("--no-op-charge", action="store_true")
    args = parser.parse_args()
    busy = args.busy_per_core * (os.cpu_count() or 1)
    clocks = ["measured", "wall"] if args.wall else ["measured"]
    with tempfile.TemporaryDirectory() as folder:
        for name in args.workloads.split(","):
            for clock in clocks:
                rounds = [pair(WORKLOADS[name], folder, clock, busy, args.busy_seconds)
                          for _ in range(args.rounds)]
                print(json.dumps({"workload": name, "clock": clock, "rounds": rounds}))
                print(f"{name}, host clock {clock}, {busy} busy processes: step time "
                      f"loaded/idle {spread([r['ratio'] for r in rounds])} (target within "
                      f"0.9-1.1); idle step {spread([r['idle_ms'] for r in rounds])} ms; the "
                      f"load made the runs {spread([r['wall_ratio'] for r in rounds])}x "
                      "longer in real time")
        if not args.no_op_charge:
            op_charge(folder)


if __name__ == "__main__":
    main()
