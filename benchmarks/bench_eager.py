"""Host overhead of the neuron eager path, measured against plain CPU in the same run.

Prints, for small-tensor ops, the host time per op on "neuron" (dispatch + lowering
+ simulation; best of several batches) and on "cpu", the median over those ops, and
for a training step of the reference MLP (3 x Linear(512), batch 64, AdamW) the
median step time on both and their ratio.
Targets: at most 30 us per op on neuron; an MLP step at most 3x the CPU step.

Times are the calling thread's CPU time (one intra-op thread, so all the work runs
on it): on a shared machine wall time mostly measures the other processes.
`--wall` measures wall time instead.

    python benchmarks/bench_eager.py [--repeats N] [--wall]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

_now_ns = time.thread_time_ns
from neuron_explorer.workloads.models import MLP
from neuron_explorer.workloads.training import mlp_batches

OP_TARGET_US = 30.0
STEP_TARGET_RATIO = 3.0


def _small_ops(device: str):
    a = torch.randn(4, 4).to(device)
    b = torch.randn(4, 4).to(device)
    return {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "relu": lambda: torch.relu(a),
        "sum": lambda: a.sum(dim=0),
        "mm": lambda: a @ b,
        "view": lambda: a.view(16),
        "add_": lambda: a.add_(b, alpha=0.0),
    }


def _op_us(fn, calls: int, repeats: int) -> float:
    """Per-call time of `fn`: the best of `repeats` batches, as timeit does (the other
    batches measure interference, not the code)."""
    samples = []
    for _ in range(repeats):
        start = _now_ns()
        for _ in range(calls):
            fn()
        samples.append((_now_ns() - start) / calls / 1e3)
    return min(samples)


def bench_ops(repeats: int) -> float:
    """Print per-op times; return the median over the ops of the neuron time per op (us)."""
    print(f"{'op':8s} {'neuron us':>10s} {'cpu us':>8s} {'ratio':>7s}")
    neuron_times, ratios = [], []
    cpu_ops, neuron_ops = _small_ops("cpu"), _small_ops("neuron")
    for name in cpu_ops:
        for fn in (cpu_ops[name], neuron_ops[name]):
            _op_us(fn, 50, 2)  # warm caches (lowering, op info)
        cpu_us = _op_us(cpu_ops[name], 500, repeats)
        neuron_us = _op_us(neuron_ops[name], 500, repeats)
        neuron_times.append(neuron_us)
        ratios.append(neuron_us / cpu_us)
        print(f"{name:8s} {neuron_us:10.1f} {cpu_us:8.1f} {neuron_us / cpu_us:7.1f}x")
    # The ratio to the same op on the CPU, measured alongside, moves less with load.
    print(f"median neuron / cpu time per op: {statistics.median(ratios):.1f}x")
    return statistics.median(neuron_times)


def _step_times(device: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = MLP().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(x.to(device), y.to(device)) for x, y in mlp_batches(4)]
    times = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        start = _now_ns()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device != "cpu":
            torch.neuron.synchronize()
        times.append((_now_ns() - start) / 1e6)
    return times[min(5, len(times) - 1):]  # skip warm-up (lowering caches, optimizer state)


def bench_mlp_step(steps: int) -> float:
    """Print CPU and neuron MLP step medians; return their ratio."""
    cpu, neuron = [], []
    for _ in range(3):  # interleave to share the machine's noise
        cpu += _step_times("cpu", steps)
        neuron += _step_times("neuron", steps)
    cpu_ms, neuron_ms = statistics.median(cpu), statistics.median(neuron)
    ratio = neuron_ms / cpu_ms
    print(f"MLP step (3 x Linear(512), batch 64, AdamW): neuron {neuron_ms:.2f} ms, "
          f"cpu {cpu_ms:.2f} ms, ratio {ratio:.2f}x (target <= {STEP_TARGET_RATIO}x)")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--wall", action="store_true", help="measure wall time, not CPU time")
    args = parser.parse_args()
    global _now_ns
    if args.wall:
        _now_ns = time.perf_counter_ns
    torch.set_num_threads(1)
    op_us = bench_ops(args.repeats)
    print(f"median host overhead per neuron op: {op_us:.1f} us "
          f"({op_us / OP_TARGET_US:.2f} of the {OP_TARGET_US:.0f} us target)")
    bench_mlp_step(args.steps)


if __name__ == "__main__":
    main()
