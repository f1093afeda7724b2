"""What the host clock charges per op besides the program's own measured time.

A real `neuron` backend dispatches in C++: PyTorch's Python binding and dispatcher
(measured in place: they run here as they would there), then the backend's C++
kernel (shape checks, output allocation: `BACKEND_OP_NS`), then the runtime's launch
path (the preset's `host_launch_overhead_ns`, about 50 µs per kernel from published
traces of single NKI kernels on trn1). Two things of ours are not the program's and
are taken off the clock: our Python device layer (each op's whole emulation interval
is excluded by the runtime) and the C++ -> Python boxing PyTorch does to reach it,
measured once per recording (`measure_boxing_ns`). Recording's own module hooks make
every `nn.Module` call take PyTorch's slow path; that cost is measured
(`measure_module_hook_ns`) and taken off too.

Under `NEURON_HOST_CLOCK=modelled` nothing is measured: each op costs
`MODELLED_PYTHON_PER_OP_NS` of program time plus the same backend and launch costs.
docs/recording.md cites the figures.
"""

from __future__ import annotations

import time

# A C++ backend kernel's own host work per op besides launching: shape checks and
# output allocation through a caching allocator. PyTorch's operator micro-benchmarks
# put a whole small eager op (binding, dispatcher, kernel) at 2.3-3.4 µs on CPU and
# CUDA alike (pytorch/pytorch#32194, `split` 8x8); 2 µs is the part past the dispatcher.
BACKEND_OP_NS = 2_000
# Modelled mode: the program's Python and PyTorch's front end per op (argument
# parsing, autograd recording, module calls), about 5-25 µs of CPU work per eager op
# before the launch on current hosts; the MLP and GPT examples measure 8-12 µs per op
# on an idle reference host once recording's own costs are off the clock.
MODELLED_PYTHON_PER_OP_NS = 10_000

_CALLS = 200
_REPEATS = 5


class HostCosts:
    """The per-op costs in force (set by the recording that owns the clock)."""

    def __init__(self) -> None:
        self.between_ops_ns = 0  # per eager op, off the next program interval (<0: added)
        self.per_launch_ns = 0  # per compiled-graph launch, added
        self.module_hook_ns = 0  # per module hook call, off the next program interval
        self.boxing_ns = 0  # measured C++ -> Python boxing cost per op

    def configure(self, source: str, boxing_ns: int = 0, module_hook_ns: int = 0) -> None:
        """Set the charges for a clock source ("wall", "load-free" or "modelled")."""
        from neuron_explorer.backend.clock import LOAD_FREE, MODELLED

        self.boxing_ns = boxing_ns
        if source == LOAD_FREE:
            self.between_ops_ns = boxing_ns - BACKEND_OP_NS
            self.per_launch_ns = 0
            self.module_hook_ns = module_hook_ns
        elif source == MODELLED:
            self.between_ops_ns = -(MODELLED_PYTHON_PER_OP_NS + BACKEND_OP_NS)
            self.per_launch_ns = MODELLED_PYTHON_PER_OP_NS
            self.module_hook_ns = 0
        else:  # unrecorded: nobody sees the host clock, keep it as cheap as it was
            self.between_ops_ns = self.per_launch_ns = self.module_hook_ns = 0


host_costs = HostCosts()


def _best_per_call(run, calls: int = _CALLS, repeats: int = _REPEATS) -> float:
    """The fastest of `repeats` timings of `run(calls)`, per call, in ns of `run`'s own
    measure (the least disturbed round is the closest to the cost itself)."""
    return min(run(calls) for _ in range(repeats)) / calls


def measure_boxing_ns() -> int:
    """What an op on `neuron` costs outside our device layer beyond the same op on the
    CPU: PyTorch boxing the call into Python and back. 0 if it cannot be measured."""
    try:
        import torch
        from neuron_explorer.backend import runtime
        from neuron_explorer.backend.clock import clock

        a_cpu, b_cpu = torch.ones(4), torch.ones(4)
        add = torch.add
        with runtime.device_accounting_suspended():
            a, b = a_cpu.to("neuron"), b_cpu.to("neuron")

            def on_device(n: int) -> int:  # clock time: each op's own interval is excluded
                start = clock.now()
                for _ in range(n):
                    add(a, b)
                return clock.now() - start

            def on_cpu(n: int) -> int:
                start = clock.real_ns()
                for _ in range(n):
                    add(a_cpu, b_cpu)
                return clock.real_ns() - start

            device_ns = _best_per_call(on_device)
            cpu_ns = _best_per_call(on_cpu)
        return max(int(device_ns - cpu_ns), 0)
    except Exception:  # noqa: BLE001 - no device, or an odd build: charge nothing
        return 0


def measure_module_hook_ns() -> int:
    """What global module forward hooks (as recording installs them) add to one
    `nn.Module` call besides the hooks' own bodies, per hook call."""
    try:
        from torch import nn
        from torch.nn.modules import module as nn_module

        chain = nn.Sequential(*[nn.Identity() for _ in range(9)])  # 10 module calls
        x = object()

        def calls(n: int) -> int:
            start = time.thread_time_ns()
            for _ in range(n):
                chain(x)
            return time.thread_time_ns() - start

        plain = _best_per_call(calls)
        handles = [nn_module.register_module_forward_pre_hook(lambda m, a: None),
                   nn_module.register_module_forward_hook(lambda m, a, o: None, always_call=True)]
        try:
            hooked = _best_per_call(calls)
        finally:
            for handle in handles:
                handle.remove()
        return max(int((hooked - plain) / 20), 0)  # two hook calls per module call
    except Exception:  # noqa: BLE001 - measured or nothing
        return 0
