"""Compile path benchmark: the reference transformer's training step, compiled vs eager.

Prints, side by side and as ratios measured in the same run:
- compile time of the reference transformer (Dynamo + AOTAutograd + neuron compiler,
  first forward and backward), target under 10 s;
- host wall time of a compiled neuron step against the plain-CPU eager step (the
  host overhead of the simulated device), target at most 1.5x;
- kernel launches per step and device step time, eager vs compiled (and adaptive
  eager), and the largest loss difference between the eager and compiled curves;
- kernels per compiled graph launch (target: 1, the graph's program) and the device
  time of the compiled graphs alone.

    .venv/bin/python benchmarks/bench_compile.py [--steps 50]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass, field

import torch
from neuron_explorer.backend import devices
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.compiler import adaptive_mode
from neuron_explorer.backend.events import EventSink, hub
from neuron_explorer.workloads.models import GPT, lm_loss
from neuron_explorer.workloads.training import token_batches

BATCH = 8


class Counter(EventSink):
    """Counts launches and collects compile spans."""

    def __init__(self) -> None:
        self.launches = 0
        self.kernels = 0
        self.compiles: list = []
        self.graph_kernels: list[int] = []  # kernels of each compiled graph launch
        self.graph_ns = 0  # device time of compiled graphs' kernels

    def op_launched(self, ev) -> None:
        if ev.kernel_ids or ev.graph_id is not None:
            self.launches += 1
        if ev.graph_id is not None:
            self.graph_kernels.append(len(ev.kernel_ids))

    def kernel_scheduled(self, ev) -> None:
        self.kernels += 1
        if ev.name.startswith("graph_"):  # a compiled graph's program
            self.graph_ns += ev.end_ns - ev.start_ns

    def compile_event(self, ev) -> None:
        self.compiles.append(ev)


@dataclass
class Run:
    """What one training run measured, per step."""

    name: str
    losses: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)  # this process's CPU time (load-proof)
    step_ns: list[int] = field(default_factory=list)  # host clock (the simulated program)
    busy_ns: list[int] = field(default_factory=list)  # device busy time
    launches: list[int] = field(default_factory=list)
    kernels: list[int] = field(default_factory=list)

    def steady(self, values: list) -> float:
        """Median over the steps after the first (which compiles and warms caches)."""
        return statistics.median(values[1:]) if len(values) > 1 else values[0]


class Stepper:
    """One model, optimizer and (maybe compiled) loss on one device, stepped one batch
    at a time, recording what each step cost."""

    def __init__(self, name: str, model: torch.nn.Module, device: str, counter: Counter,
                 compiled: bool = False) -> None:
        torch.manual_seed(0)
        self.device = device
        self.counter = counter
        self.model = copy.deepcopy(model).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        net = self.model

        def loss_of(x, y):
            return lm_loss(net(x), y)

        self.loss_fn = torch.compile(loss_of, backend="neuron") if compiled else loss_of
        self.timeline = devices.get(0).timeline if device == "neuron" else None
        self.run = Run(name)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        run, counter, timeline = self.run, self.counter, self.timeline
        launches, kernels = counter.launches, counter.kernels
        busy = timeline.busy_ns if timeline else 0
        host_start, wall_start, cpu_start = clock.now(), time.perf_counter(), time.process_time()
        x, y = x.to(self.device), y.to(self.device)
        loss = self.loss_fn(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        run.losses.append(loss.item())  # a sync point: the step's device work is done
        run.wall_s.append(time.perf_counter() - wall_start)
        run.cpu_s.append(time.process_time() - cpu_start)
        run.step_ns.append(clock.now() - host_start)
        run.busy_ns.append((timeline.busy_ns - busy) if timeline else 0)
        run.launches.append(counter.launches - launches)
        run.kernels.append(counter.kernels - kernels)


def run_interleaved(steppers: list[Stepper], batches: list) -> None:
    """Step every stepper on each batch in turn, so machine load hits all alike."""
    for x, y in batches:
        for stepper in steppers:
            stepper.step(x, y)


def compile_breakdown(counter: Counter) -> dict[str, float]:
    """Seconds per compile span kind (outermost Dynamo spans only)."""
    out: dict[str, float] = {}
    for ev in counter.compiles:
        if ev.end_ns > ev.start_ns:
            out[ev.kind] = out.get(ev.kind, 0.0) + (ev.end_ns - ev.start_ns) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT()
    counter = Counter()
    hub.subscribe(counter)

    batches = token_batches(args.steps, BATCH, model.cfg.seq_len, model.cfg.vocab_size)
    cpu_stepper = Stepper("cpu eager", model, "cpu", counter)
    compiled_stepper = Stepper("neuron compiled", model, "neuron", counter, compiled=True)
    run_interleaved([cpu_stepper, compiled_stepper], batches)
    spans = compile_breakdown(counter)
    eager_stepper = Stepper("neuron eager", model, "neuron", counter)
    run_interleaved([eager_stepper], batches)
    adaptive_mode.set_mode("adaptive")
    adaptive_stepper = Stepper("neuron adaptive", model, "neuron", counter)
    run_interleaved([adaptive_stepper], batches)
    adaptive_mode.set_mode("immediate")
    cpu, compiled = cpu_stepper.run, compiled_stepper.run
    eager, adaptive = eager_stepper.run, adaptive_stepper.run

    print(f"reference transformer: GPT {model.cfg}, batch {BATCH}, {args.steps} steps\n")
    compile_s = compiled.wall_s[0] - compiled.steady(compiled.wall_s)
    compile_cpu_s = compiled.cpu_s[0] - compiled.steady(compiled.cpu_s)
    print(f"compile time (first step minus a steady step): {compile_s:.2f} s wall, "
          f"{compile_cpu_s:.2f} s of this process's CPU time "
          f"(target < 10 s: {'ok' if compile_s < 10 else 'MISSED'})")
    print("  spans: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(spans.items())))

    print(f"\n{'run':18} {'wall/step':>10} {'launches':>9} {'kernels':>8} "
          f"{'device busy':>12} {'step (sim)':>11}")
    for run in (cpu, eager, adaptive, compiled):
        print(f"{run.name:18} {run.steady(run.wall_s) * 1e3:8.1f}ms "
              f"{run.steady(run.launches):9.0f} {run.steady(run.kernels):8.0f} "
              f"{run.steady(run.busy_ns) / 1e6:10.3f}ms {run.steady(run.step_ns) / 1e6:9.3f}ms")

    # Per-batch ratios of interleaved steps, then the median: robust to load that
    # changes over the run (the machine is shared).
    host_ratio = statistics.median(
        c / p for c, p in zip(compiled.wall_s[1:], cpu.wall_s[1:], strict=True))
    host_cpu_ratio = statistics.median(
        c / p for c, p in zip(compiled.cpu_s[1:], cpu.cpu_s[1:], strict=True))
    print(f"\nhost overhead, compiled neuron step / plain-CPU step: {host_ratio:.2f}x wall, "
          f"{host_cpu_ratio:.2f}x CPU time "
          f"(target <= 1.5x: {'ok' if host_ratio <= 1.5 else 'MISSED'})")
    print(f"launches per step, eager / compiled: "
          f"{eager.steady(eager.launches) / compiled.steady(compiled.launches):.1f}x fewer")
    print(f"device busy per step, compiled / eager: "
          f"{compiled.steady(compiled.busy_ns) / eager.steady(eager.busy_ns):.2f}x")
    print(f"simulated step time, compiled / eager: "
          f"{compiled.steady(compiled.step_ns) / eager.steady(eager.step_ns):.2f}x")
    print(f"device busy per step, adaptive / eager: "
          f"{adaptive.steady(adaptive.busy_ns) / eager.steady(eager.busy_ns):.2f}x")
    steps_run = len(compiled.losses)
    print(f"compiled graphs: {len(counter.graph_kernels) / steps_run:.0f} launches per step, "
          f"{max(counter.graph_kernels)} kernel(s) per launch (target 1), "
          f"{counter.graph_ns / steps_run / 1e6:.3f} ms of device time per step in them")
    diff = max(abs(a - b) for a, b in zip(eager.losses, compiled.losses, strict=True))
    cpu_diff = max(abs(a - b) for a, b in zip(eager.losses, cpu.losses, strict=True))
    adaptive_diff = max(abs(a - b) for a, b in zip(eager.losses, adaptive.losses, strict=True))
    print(f"loss curves over {args.steps} steps, max |eager - compiled| = {diff:.2e}, "
          f"|eager - cpu| = {cpu_diff:.2e}, |eager - adaptive| = {adaptive_diff:.2e}")


if __name__ == "__main__":
    main()
