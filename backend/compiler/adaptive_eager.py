"""Adaptive eager: queue eager ops' device work and run fusible runs as one kernel.

Numbers are computed on the host as each op is dispatched, exactly as in immediate
mode; only the device accounting is deferred. Ops whose kernels are plain streams
(elementwise, reductions, norms) wait in a bounded queue; at the next sync point,
at the next op that cannot join, or when the queue is full, the queued run becomes
one fused kernel, launched in op order. Eager code may read any result later, so
every result is still stored to HBM; what the fused kernel saves is each op's launch
latency and fixed costs, and the reloads of inputs an earlier op of the run
produced (matched by shape and dtype, the only data-flow an op key carries).

Host time: queueing an op launches nothing, so it costs no launch overhead (the
presets model no separate dispatch cost, so queueing is free); each fused run pays
one host launch overhead when it launches, charged to whatever made it launch (the
op that cannot join, a full queue, a sync point or a compiled graph's launch).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuron_explorer.backend import runtime
from neuron_explorer.backend.compiler.stream_steps import scaled, steps_for
from neuron_explorer.backend.hardware import Kernel, KernelBuilder
from neuron_explorer.backend.hardware.streaming import Step, stream
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.op_families import base_name
from neuron_explorer.common.presets import HardwarePreset

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice

MAX_QUEUED_OPS = 32  # a run longer than this is launched without waiting for a sync
MAX_CACHED_RUNS = 4096  # fused kernels kept, keyed by the run's op keys


@dataclass(slots=True)
class _Queued:
    key: tuple
    op_id: int
    issued_ns: int  # host time the op was issued
    steps: list[Step]


def _dtype(d: object) -> str:
    return str(d).removeprefix("torch.")


def _sig_numel(sig: tuple) -> int:
    return math.prod(sig[0])


def _sig_bytes(sig: tuple) -> int:
    return _sig_numel(sig) * dtype_bytes(_dtype(sig[1]))


def _sig_id(sig: tuple) -> tuple:
    return tuple(sig[0]), _dtype(sig[1])


def fused_run_kernel(keys: list[tuple], steps: list[list[Step]], preset: HardwarePreset
                     ) -> Kernel:
    """One stream kernel for a run of eager ops (keys in op order)."""
    elements = max([_sig_numel(s) for k in keys for s in (*k[1], *k[2])] + [1])
    produced: dict[tuple, int] = {}  # (shape, dtype) -> results of the run not yet reused
    full_in: list[int] = []
    small_in: list[int] = []
    full_out: list[int] = []
    small_out: list[int] = []
    resident = 0
    all_steps: list[Step] = []
    names = []
    for key, own in zip(keys, steps, strict=True):
        name, inputs, outputs = key[0], key[1], key[2]
        names.append(base_name(name).strip("_"))
        for sig in inputs:
            ident = _sig_id(sig)
            if produced.get(ident):
                resident += 1  # an earlier op of the run made it: still in SBUF
                continue
            (full_in if _sig_numel(sig) == elements else small_in).append(_sig_bytes(sig))
        for sig in outputs:
            ident = _sig_id(sig)
            produced[ident] = produced.get(ident, 0) + 1
            (full_out if _sig_numel(sig) == elements else small_out).append(_sig_bytes(sig))
        touched = max([_sig_numel(s) for s in (*inputs, *outputs)] + [0])
        all_steps.extend(scaled(own, touched / elements))
    shown = names[:6] + ([f"{len(names) - 6}more"] if len(names) > 6 else [])
    b = KernelBuilder(preset, "adaptive_" + "_".join(shown))
    biggest = max((s for k in keys for s in (*k[1], *k[2])), key=_sig_numel, default=None)
    dtype = _dtype(biggest[1]) if biggest is not None else "float32"
    stream(b, elements, dtype, all_steps, inputs=full_in, outputs=full_out,
           small_inputs=small_in, small_outputs=small_out, resident_inputs=resident)
    return b.build()


class AdaptivePolicy:
    """An eager policy (see `runtime.set_eager_policy`) that fuses runs of stream ops."""

    def __init__(self, max_queued: int = MAX_QUEUED_OPS) -> None:
        self.max_queued = max_queued
        self._lock = threading.RLock()  # a sink may sync (and flush) while we launch
        self._device: NeuronDevice | None = None
        self._queue: list[_Queued] = []
        self._kernels: dict[tuple, Kernel] = {}
        self.fused_launches = 0  # fused kernels launched (for tests and benchmarks)
        self.fused_ops = 0  # eager ops they covered

    def submit(self, device: NeuronDevice, key: tuple, op_id: int, host_ns: int
               ) -> runtime.Launched:
        lowered = runtime.lower(device, key)
        if lowered.kernel is None:
            return runtime.NO_LAUNCH if not lowered.fallback else \
                runtime.Launched((), 0, 0, True)
        steps = None if lowered.fallback else self._steps(key)
        spent = 0  # host time of the launches this op causes
        with self._lock:
            if steps is None or (self._device is not None and self._device is not device):
                spent = self._flush(host_ns)
            if steps is None:  # cannot join a stream: launch it now, after the run
                spent += device.preset.host_launch_overhead_ns
                kernel_id = runtime.schedule(device, lowered.kernel, op_id, host_ns + spent,
                                             lowered.fallback)
                return runtime.Launched((kernel_id,), lowered.flops, lowered.hbm_bytes,
                                        lowered.fallback, spent)
            self._device = device
            self._queue.append(_Queued(key, op_id, host_ns + spent, steps))
            if len(self._queue) >= self.max_queued:
                spent += self._flush(host_ns + spent)
        # The kernel id is not known yet: the fused kernel's KernelRun names the run's
        # first op, which is how the trace links them.
        return runtime.Launched((), lowered.flops, lowered.hbm_bytes, False, spent)

    @staticmethod
    def _steps(key: tuple) -> list[Step] | None:
        inputs, outputs, attrs = key[1], key[2], key[3]
        if any(name == "direction" and value != "device_to_device" for name, value in attrs):
            return None  # a copy over the host link, not a stream on the core
        converts = bool(inputs and outputs) and inputs[0][1] != outputs[0][1]
        return steps_for(key[0], len(inputs), converts)

    def flush(self, host_ns: int) -> int:
        """Launch whatever is queued, issued at `host_ns`; return the host time it cost
        (the runtime calls this before every sync point and compiled-graph launch)."""
        with self._lock:
            return self._flush(host_ns)

    def _flush(self, host_ns: int) -> int:
        queue, device = self._queue, self._device
        if not queue:
            return 0
        self._queue, self._device = [], None
        assert device is not None  # set with the first op queued
        overhead = device.preset.host_launch_overhead_ns
        launch_ns = max(host_ns, queue[-1].issued_ns) + overhead
        if len(queue) == 1:
            only = queue[0]
            kernel = runtime.lower(device, only.key).kernel
        else:
            keys = [q.key for q in queue]
            cache_key = (id(device.preset), tuple(keys))
            kernel = self._kernels.get(cache_key)
            if kernel is None:
                kernel = fused_run_kernel(keys, [q.steps for q in queue], device.preset)
                if len(self._kernels) >= MAX_CACHED_RUNS:
                    self._kernels.pop(next(iter(self._kernels)))
                self._kernels[cache_key] = kernel
            self.fused_launches += 1
            self.fused_ops += len(queue)
        runtime.schedule(device, kernel, queue[0].op_id, launch_ns)
        return overhead
