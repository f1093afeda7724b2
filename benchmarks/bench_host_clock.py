"""The host clock against machine load: the same script recorded on the machine as it is
and with two busy processes per core gives the same step times.

For each workload, rounds of: record it as the machine is ("idle"), and record it
again while 2 x cores busy-looping processes run (spawned here, each ending itself
after `--busy-seconds` and killed at the end of the run at the latest); odd rounds
record the loaded run first, so a drift of the machine's speed over the rounds does
not favour one side. The figure is the median step time of the recorded steps after
the first two (warm-up), read from the trace; the ratio loaded/idle is reported per
round, then its median and spread.

The CPU itself may run at another speed in the two runs of a pair: on a virtual
machine the hypervisor shares the physical cores with other guests, and other work
shares the caches; no clock inside the guest can see that (on this machine the same
fixed Python loop took 14.7 µs a chunk, and 25.5 µs a few minutes later, with no busy
process of this benchmark running). So right before and after each
recording, a probe times a fixed Python loop under the same conditions, with the same
load-free measure as the clock (monotonic time minus the thread's run delay). The
probe's loaded/idle ratio is the CPU's own slowdown; the step ratio divided by it is
what the host clock did not take out of the load.
The host's CPU itself can get slower under load for a program with a large working set
(caches, TLBs and branch predictors shared with the busy processes, or a hypervisor that
gives a loaded guest less): thread CPU time then rises, and no clock that measures the
program can take that out. So right after each recording, the same script runs in plain
PyTorch on the CPU (`--device cpu`, one intra-op thread, no recorder) and its median CPU
time per optimizer step is read: its loaded/idle ratio is what this host does to a
training step's own CPU work under the load, the reference for the recorded ratio.
With `--wall`, the same pairs are also recorded with `NEURON_HOST_CLOCK=wall` (real
time minus emulation, the clock before the load-free one), for contrast.

Second part: whether this host's CPU slows with no preemption at all. A plain PyTorch
training step (an 8-layer MLP with AdamW, on the CPU, one thread) runs pinned to CPU 0
alone, in pairs of segments about a second long: the other CPUs idle, then two busy
processes on each of them (none on CPU 0). Nothing takes CPU 0 from the step, so its
CPU time can only change with the CPU's own speed: the hypervisor's placement of the
virtual CPUs on shared physical cores, shared caches and power. The ratio busy/idle per
pair is that slowdown; where it is above 1.1, no clock that measures the program can
meet the first part's target on that host. (Needs two CPUs or more.)

Third part: what one recorded op is charged on the host (op slice + the program
time before it) in a tight loop of tiny adds, against what the same op costs in
plain torch on the CPU (best of the rounds), and the parts of the charge.

    python benchmarks/bench_host_clock.py [--rounds 3] [--workloads mlp,gpt] [--wall]
    python benchmarks/bench_host_clock.py --script "my_train.py --steps 40" ...

A script of your own is recorded as it is, and run in plain PyTorch with `--device cpu`
appended to its arguments: it must take that option.

Other work on a shared machine loads both runs of a pair alike; the busy processes
come on top of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
    "cnn": [os.path.join(HERE, "programs", "cnn_dataloader.py")],
}
PROBE = r'''
import os, time
fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
def run_delay():
    return int(os.pread(fd, 96, 0).split()[1])
def work():
    table = {}
    for i in range(200_000):
        table[i % 97] = table.get(i % 97, 0) + i * i
    return table
work()
best = []
for _ in range(5):
    wall, delay = time.perf_counter_ns(), run_delay()
    work()
    best.append((time.perf_counter_ns() - wall) - (run_delay() - delay))
best.sort()
print(best[len(best) // 2])
'''
PLAIN = r'''
import runpy, statistics, sys, time, torch
from torch.optim.optimizer import register_optimizer_step_post_hook
torch.set_num_threads(1)
marks = []
register_optimizer_step_post_hook(
    lambda *_: marks.append(time.thread_time_ns()))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
steps = [b - a for a, b in zip(marks, marks[1:])][2:]
print(statistics.median(steps))
'''
PINNED = r'''
import os, statistics, subprocess, sys, time, torch
pairs, busy_code = int(sys.argv[1]), sys.argv[2]
others = sorted(os.sched_getaffinity(0) - {0})
os.sched_setaffinity(0, {0})
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
x = torch.randn(16, 64)
opt = torch.optim.AdamW(model.parameters())
def step():
    start = time.thread_time_ns()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    return time.thread_time_ns() - start
ratios = []
for _ in range(pairs):
    medians = []
    for busy in (False, True):
        procs = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c",
                                   busy_code, "30"])
                 for cpu in others for _ in range(2)] if busy else []
        time.sleep(0.2 if busy else 0.05)
        medians.append(statistics.median([step() for _ in range(170)][20:]))
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
    ratios.append(medians[1] / medians[0])
print(" ".join(f"{r:.4f}" for r in ratios))
'''
BUSY = ("import time, sys\nend = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end: pass\n")

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


def probe_ns() -> float:
    """The fixed loop's load-free time (median of 5), in a fresh process as the recording."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout
    return float(out.split()[-1])


def plain_step_ns(argv: list[str]) -> float:
    """The script's median CPU time per optimizer step in plain PyTorch on the CPU."""
    cmd = [sys.executable, "-c", PLAIN, *argv, "--device", "cpu"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1])


def probed_record(argv: list[str], out: str,
                  clock: str) -> tuple[float, float, float, float]:
    """(median step ms, wall seconds, CPU probe ns: the mean of one before and one after,
    plain PyTorch's CPU time per step in ns)."""
    before = probe_ns()
    step, wall = record(argv, out, clock)
    probe = (before + probe_ns()) / 2
    return step, wall, probe, plain_step_ns(argv)


def loaded_record(argv: list[str], out: str, clock: str, busy: int,
                  busy_seconds: float) -> tuple[float, float, float, float]:
    procs = start_busy(busy, busy_seconds)
    try:
        time.sleep(0.3)  # let them take the cores
        return probed_record(argv, out, clock)
    finally:
        stop_busy(procs)


def pair(argv: list[str], folder: str, clock: str, busy: int, busy_seconds: float,
         loaded_first: bool) -> dict:
    idle_path, loaded_path = (os.path.join(folder, f"{kind}.pftrace")
                              for kind in ("idle", "loaded"))
    if loaded_first:
        loaded = loaded_record(argv, loaded_path, clock, busy, busy_seconds)
        idle = probed_record(argv, idle_path, clock)
    else:
        idle = probed_record(argv, idle_path, clock)
        loaded = loaded_record(argv, loaded_path, clock, busy, busy_seconds)
    ratio, cpu_ratio, plain_ratio = loaded[0] / idle[0], loaded[2] / idle[2], loaded[3] / idle[3]
    return {"idle_ms": idle[0], "loaded_ms": loaded[0], "ratio": ratio,
            "cpu_ratio": cpu_ratio, "ratio_at_equal_cpu": ratio / cpu_ratio,
            "plain_idle_ms": idle[3] / 1e6, "plain_loaded_ms": loaded[3] / 1e6,
            "plain_ratio": plain_ratio, "ratio_over_plain": ratio / plain_ratio,
            "wall_ratio": loaded[1] / idle[1], "loaded_first": loaded_first}


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


def host_slowdown_without_preemption(pairs: int) -> None:
    """The second part (see the module's text)."""
    if (os.cpu_count() or 1) < 2:
        print("host slowdown without preemption: needs two CPUs or more, skipped")
        return
    out = subprocess.run([sys.executable, "-c", PINNED, str(pairs), BUSY], capture_output=True,
                         text=True, check=True).stdout
    ratios = [float(v) for v in out.split()]
    print(json.dumps({"pinned_slowdown": ratios}))
    print(f"host slowdown without preemption: a plain PyTorch step alone on CPU 0, CPU time "
          f"with the other CPUs busy over idle: {spread(ratios)} (1.0: the host's CPU keeps "
          "its speed under load)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="mlp,gpt", help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--script", default="",
                        help="a script of yours and its arguments, instead of --workloads "
                             "(it must take --device cpu)")
    parser.add_argument("--busy-per-core", type=int, default=2)
    parser.add_argument("--busy-seconds", type=float, default=120.0,
                        help="each busy process ends itself after this long at the latest")
    parser.add_argument("--wall", action="store_true",
                        help="also record with NEURON_HOST_CLOCK=wall, for contrast")
    parser.add_argument("--no-op-charge", action="store_true")
    parser.add_argument("--pinned-pairs", type=int, default=8,
                        help="pairs of segments for the slowdown without preemption (0: skip)")
    args = parser.parse_args()
    busy = args.busy_per_core * (os.cpu_count() or 1)
    clocks = ["measured", "wall"] if args.wall else ["measured"]
    with tempfile.TemporaryDirectory() as folder:
        workloads = ({args.script: shlex.split(args.script)} if args.script else
                     {name: WORKLOADS[name] for name in args.workloads.split(",")})
        for name, argv in workloads.items() if args.rounds > 0 else ():
            for clock in clocks:
                rounds = [pair(argv, folder, clock, busy, args.busy_seconds,
                               loaded_first=index % 2 == 1) for index in range(args.rounds)]
                print(json.dumps({"workload": name, "clock": clock, "rounds": rounds}))
                print(f"{name}, host clock {clock}, {busy} busy processes: step time "
                      f"loaded/idle {spread([r['ratio'] for r in rounds])} (target within "
                      f"0.9-1.1); the CPU's own speed loaded/idle (probe) "
                      f"{spread([r['cpu_ratio'] for r in rounds])}; step ratio at equal CPU "
                      f"speed {spread([r['ratio_at_equal_cpu'] for r in rounds])}; plain "
                      f"PyTorch on the CPU, CPU time per step, loaded/idle "
                      f"{spread([r['plain_ratio'] for r in rounds])}; recorded ratio over "
                      f"plain {spread([r['ratio_over_plain'] for r in rounds])}; idle step "
                      f"{spread([r['idle_ms'] for r in rounds])} ms; the "
                      f"load made the runs {spread([r['wall_ratio'] for r in rounds])}x "
                      "longer in real time")
        if args.pinned_pairs > 0:
            host_slowdown_without_preemption(args.pinned_pairs)
        if not args.no_op_charge:
            op_charge(folder)


if __name__ == "__main__":
    main()
