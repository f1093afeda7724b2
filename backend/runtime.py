"""The device runtime: launches kernels on the simulated timeline and keeps the two clocks.

Eager ops and compiled graphs both go through here. The API the compile path uses:

- ``launch_kernels(device_index, kernels, op_name, input_shapes, input_dtypes, flops,
  hbm_bytes, graph_id=None) -> op_id``: one launch of a compiled graph. Launches the
  eager work the policy still holds first (it was issued earlier), then emits one
  ``OpLaunch`` and one ``KernelRun`` per kernel, schedules the kernels back to back
  on the device timeline from the launch time, and advances the host clock by the
  preset's host launch overhead (the real time spent in the call is excluded).
- ``device_accounting_suspended()``: a context manager inside which `neuron` ops
  compute their numbers but launch no kernels and emit no op events (a compiled
  graph runs its ops for the numbers and is charged as its fused kernels). The
  real time spent inside is excluded from the host clock.
- ``set_eager_policy(policy)``: every eager op's device work goes through
  ``policy.submit(device, key, op_id, host_ns) -> Launched(kernel_ids, flops,
  hbm_bytes, fallback, host_ns)`` (``NO_LAUNCH`` when nothing ran yet), where the
  argument is the host time the op was issued and the returned ``host_ns`` is the
  host time its launches cost (each launch pays the preset's host launch overhead
  and starts on the device once paid). The default, ``ImmediatePolicy``, lowers
  (cached by ``key``) and launches at once. A policy that queues ops must launch them
  in ``flush(host_ns) -> host ns spent``, which the runtime calls before every sync
  point and every compiled-graph launch (``flush_eager()`` does it from outside).
  The host clock advances by exactly the ``host_ns`` a policy reports.
  ``key`` is an ``OpKey`` tuple ``(op_name, inputs, outputs, attrs)`` (inputs and
  outputs are ``((shape, dtype), ...)``); ``spec_for(key)`` turns it into the
  hardware's ``OpSpec``; ``lower(device, key)`` gives the cached ``Lowered(kernel,
  fallback, flops, hbm_bytes)`` (host<->device copies become host-link transfers);
  ``schedule(device, kernel, op_id, launch_ns, fallback)`` places one kernel and
  returns its kernel id. ``set_eager_policy(None)`` restores the default.
- Per op, besides the launches, the host clock is charged the framework cost in
  ``host_costs`` (backend/host_costs.py): our C++ -> Python boxing taken off and a C++
  backend's per-op cost added, or under the modelled clock a fixed program cost per
  op; both are applied to the program interval after the op (``clock.defer``).
- ``synchronize(device_index, kind)``: a sync point (flushes the policy, the host
  waits for the device, a ``SyncWait`` is emitted; index -1: every device).
  ``new_op_id()`` hands out correlation ids.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch
from neuron_explorer.backend import devices
from neuron_explorer.backend.allocator import context as allocation_context
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.events import Instruction, KernelRun, OpLaunch, SyncWait, hub
from neuron_explorer.backend.host_costs import host_costs

if TYPE_CHECKING:  # the cost model loads on first use, not at import
    from neuron_explorer.backend.hardware import Kernel

_perf_ns = clock.real_ns

OpKey = tuple  # (op_name, ((shape, dtype), ...) inputs, ((shape, dtype), ...) outputs, attrs)

_op_ids = itertools.count(1)
_kernel_ids = itertools.count(1)
new_op_id = _op_ids.__next__
new_kernel_id = _kernel_ids.__next__  # collectives (backend/distributed) share the ids


def next_op_id() -> int:
    """A fresh op id, for an op that allocates nothing (`record_eager` takes it)."""
    return next(_op_ids)


def begin_op(host_start_ns: int) -> int:
    """A fresh op id for the op about to be emulated (from `host_start_ns` on the host
    clock); its allocations will name it and be dated at its start."""
    op_id = next(_op_ids)
    if hub.active and state.accounting:
        allocation_context.op_id = op_id
        allocation_context.host_ns = host_start_ns
    return op_id


class Lowered(NamedTuple):
    """What one op becomes on the device: a kernel (None: no device work) and whether it
    runs on the host."""

    kernel: Kernel | None
    fallback: bool
    flops: int
    hbm_bytes: int


class Launched(NamedTuple):
    """What a policy reports for one submitted op."""

    kernel_ids: tuple[int, ...]
    flops: int
    hbm_bytes: int
    fallback: bool
    host_ns: int = 0  # host time the launches made during the submit cost


NO_LAUNCH = Launched((), 0, 0, False)


class EagerPolicy(Protocol):
    """Decides when and as what the device runs eager ops."""

    def submit(self, device: devices.NeuronDevice, key: OpKey, op_id: int,
               host_ns: int) -> Launched: ...

    def flush(self, host_ns: int) -> int: ...


class _State:
    """Mutable runtime switches read on the hot path."""

    __slots__ = ("accounting", "policy", "suspended_depth")

    def __init__(self) -> None:
        self.accounting = True  # False inside device_accounting_suspended()
        self.suspended_depth = 0
        self.policy: EagerPolicy = ImmediatePolicy()


_lowered: dict[OpKey, Lowered] = {}
_warned_fallback: set[str] = set()


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


_signatures: dict[tuple, tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]] = {}
_SIGNATURE_LIMIT = 50_000


def _input_signature(inputs: tuple) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """An op key's inputs as (shapes, dtype names), built once per signature: ops with
    the same inputs repeat every step."""
    found = _signatures.get(inputs)
    if found is None:
        if len(_signatures) > _SIGNATURE_LIMIT:
            _signatures.clear()
        found = _signatures[inputs] = (tuple(tuple(s) for s, _ in inputs),
                                       tuple(_dtype_name(d) for _, d in inputs))
    return found


_INTERNAL_PATHS = (os.path.dirname(os.path.abspath(__file__)),
                   os.path.dirname(os.path.abspath(torch.__file__)))


def _user_stacklevel() -> int:
    """The stacklevel that points a warning at the first frame outside torch and this
    package (the recorder's hooks included: under `record` a backward's warnings pointed
    at them)."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and _internal(frame):
        frame, level = frame.f_back, level + 1
    return level


def _internal(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__") or ""
    return (frame.f_code.co_filename.startswith(_INTERNAL_PATHS)
            or module.startswith("neuron_explorer."))


def spec_for(key: OpKey):
    """The hardware's OpSpec for an op key."""
    from neuron_explorer.backend.hardware import OpSpec, TensorSpec

    name, inputs, outputs, attrs = key
    return OpSpec(
        name=name,
        inputs=tuple(TensorSpec(tuple(s), _dtype_name(d)) for s, d in inputs),
        outputs=tuple(TensorSpec(tuple(s), _dtype_name(d)) for s, d in outputs),
        attrs=dict(attrs),
    )


def lower(device: devices.NeuronDevice, key: OpKey) -> Lowered:
    """Lower an op to a kernel for this device's preset, once per signature."""
    found = _lowered.get(key)
    if found is not None:
        return found
    from neuron_explorer.backend.hardware import NoLowering, lower_host_fallback, lower_op

    direction = _transfer_direction(key)
    if direction is not None:
        found = _lower_transfer(device, key, direction)
        _lowered[key] = found
        return found
    spec = spec_for(key)
    try:
        kernel = lower_op(spec, device.preset)
        fallback = False
    except NoLowering:
        kernel = lower_host_fallback(spec, device.preset)
        fallback = True
        if key[0] not in _warned_fallback:
            _warned_fallback.add(key[0])
            warnings.warn(
                f"{key[0]} has no neuron device lowering: it runs on the host, and the "
                "copies to and from the host are charged on the device timeline",
                stacklevel=_user_stacklevel(),
            )
    if kernel is None:
        found = Lowered(None, fallback, 0, 0)
    else:
        found = Lowered(kernel, fallback, kernel.model_flops, kernel.hbm_bytes)
    _lowered[key] = found
    return found


HOST_TO_DEVICE = "host_to_device"
DEVICE_TO_HOST = "device_to_host"


def _transfer_direction(key: OpKey) -> str | None:
    """"host_to_device" / "device_to_host" for copies across the host link, else None."""
    for name, value in key[3]:
        if name == "direction" and value in (HOST_TO_DEVICE, DEVICE_TO_HOST):
            return value
    return None


def _nbytes(tensors) -> int:
    total = 0
    for shape, dtype in tensors:
        n = dtype.itemsize if hasattr(dtype, "itemsize") else 4
        for d in shape:
            n *= d
        total += n
    return total


def _lower_transfer(device: devices.NeuronDevice, key: OpKey, direction: str) -> Lowered:
    """A copy between host memory and HBM: a DMA over the host link."""
    from neuron_explorer.backend.hardware import lower_host_transfer

    to_device = direction == HOST_TO_DEVICE
    nbytes = _nbytes(key[2] if to_device else key[1])
    kernel = lower_host_transfer(nbytes, device.preset, to_device=to_device)
    return Lowered(kernel, False, 0, kernel.hbm_bytes)


def schedule(device: devices.NeuronDevice, kernel, op_id: int, launch_ns: int,
             fallback: bool = False) -> int:
    """Place one kernel on the device timeline; emit its KernelRun; return its id."""
    kernel_id = next(_kernel_ids)
    start, end = device.timeline.schedule(kernel, launch_ns)
    if hub.active:
        instructions = None
        if hub.want_instructions:
            instructions = [Instruction(*row) for row in kernel.instructions(start)]
        hub.kernel_scheduled(KernelRun(
            kernel_id, op_id, kernel.name, device.index, launch_ns, start, end,
            kernel.flops, kernel.model_flops, kernel.hbm_bytes, kernel.engine_busy_ns,
            kernel.sbuf_bytes, kernel.psum_bytes, fallback, instructions,
            kernel if hub.want_instruction_arrays else None,
        ))
    return kernel_id


class ImmediatePolicy:
    """The default eager policy: lower each op (cached) and launch it at once."""

    def submit(self, device: devices.NeuronDevice, key: OpKey, op_id: int,
               host_ns: int) -> Launched:
        lowered = _lowered.get(key) or lower(device, key)
        if lowered.kernel is None:
            return NO_LAUNCH if not lowered.fallback else Launched((), 0, 0, True)
        overhead = device.preset.host_launch_overhead_ns
        kernel_id = schedule(device, lowered.kernel, op_id, host_ns + overhead,
                             lowered.fallback)
        return Launched((kernel_id,), lowered.flops, lowered.hbm_bytes, lowered.fallback,
                        overhead)

    def flush(self, host_ns: int) -> int:
        """Nothing is ever queued."""
        return 0


state = _State()


def flush_eager() -> None:
    """Launch the eager work the policy holds now, charging its launches to the host."""
    real_start, now = clock.stamp()
    spent = state.policy.flush(now)
    clock.exclude(_perf_ns() - real_start - spent)


def set_eager_policy(policy: EagerPolicy | None) -> None:
    """Route every eager op's device work through `policy` (None: launch immediately)."""
    flush_eager()
    state.policy = policy if policy is not None else ImmediatePolicy()


_slow_op: list = [None, 1 << 62]  # (listener(key, real_ns), threshold ns): see below


def set_slow_op_listener(listener: Callable[[OpKey, int], None] | None,
                         threshold_ns: int = 0) -> None:
    """Call `listener(key, ns)` for each recorded op whose emulation took at least
    `threshold_ns` (a recording explains slow runs with it); None removes it."""
    _slow_op[:] = [listener, threshold_ns if listener is not None else 1 << 62]


def abandon_op() -> None:
    """The op being emulated raised: later allocations are not its."""
    allocation_context.op_id = None


def record_eager(device: devices.NeuronDevice, key: OpKey, real_start_ns: int,
                 host_start_ns: int, op_id: int | None = None,
                 producers: tuple[int, ...] = ()) -> int:
    """Account one dispatched eager op: submit it, emit its OpLaunch, settle the host clock.

    Called at the end of the op's emulation; `real_start_ns`/`host_start_ns` are the real
    and host clocks when dispatch began; `op_id` is the one `begin_op` gave (a new one
    if None). Returns the op id.
    """
    if op_id is None:
        op_id = next(_op_ids)
    overhead = device.preset.host_launch_overhead_ns
    if not hub.active and type(state.policy) is ImmediatePolicy:
        # The common case, inlined: nobody listens and the default policy is in force.
        lowered = _lowered.get(key) or lower(device, key)
        if lowered.kernel is None:
            overhead = 0
        else:
            next(_kernel_ids)
            device.timeline.schedule(lowered.kernel, host_start_ns + overhead)
        clock.exclude(_perf_ns() - real_start_ns - overhead)
        if host_costs.between_ops_ns:
            clock.defer(host_costs.between_ops_ns, host_start_ns + overhead)
        allocation_context.op_id = None
        return op_id
    launched = state.policy.submit(device, key, op_id, host_start_ns)
    overhead = launched.host_ns  # views, allocations and queued ops launch nothing now
    host_end = host_start_ns + overhead
    if hub.active:
        shapes, dtypes = _input_signature(key[1])
        hub.op_launched(OpLaunch(
            op_id, key[0], device.index, host_start_ns, host_end, shapes, dtypes,
            launched.flops, launched.hbm_bytes, launched.fallback, launched.kernel_ids,
            threading.get_ident(), None, key, producers,
        ))
    # The host clock moves by the modelled launch overhead, not by the emulation time.
    spent = _perf_ns() - real_start_ns
    clock.exclude(spent - overhead)
    if spent > _slow_op[1] and _slow_op[0] is not None:
        _slow_op[0](key, spent)
    if host_costs.between_ops_ns:
        clock.defer(host_costs.between_ops_ns, host_end)
    # Only now: a release until here is inside the interval just excluded.
    allocation_context.op_id = None
    return op_id


def launch_kernels(device_index: int, kernels: Sequence, op_name: str,
                   input_shapes: Sequence[Sequence[int]], input_dtypes: Sequence[str],
                   flops: int, hbm_bytes: int, graph_id: int | None = None,
                   made_by: Sequence[int] = ()) -> int:
    """Launch a compiled graph's kernels as one op; return its op id (see module doc).
    `made_by`: per tensor input, the op id that made it (0: none recorded)."""
    real_start, host_start = clock.stamp()
    # Eager work a policy still holds was issued before this graph: it launches first.
    queued_ns = state.policy.flush(host_start)
    host_start += queued_ns
    device = devices.get(device_index)
    op_id = next(_op_ids)
    overhead = device.preset.host_launch_overhead_ns
    host_end = host_start + overhead
    kernel_ids = tuple(schedule(device, k, op_id, host_end) for k in kernels)
    if hub.active:
        # a graph holding ops with no device lowering ran them on the host: a fallback op
        fallback = any(getattr(k, "host_fallbacks", ()) for k in kernels)
        hub.op_launched(OpLaunch(
            op_id, op_name, device.index, host_start, host_end,
            tuple(tuple(s) for s in input_shapes), tuple(str(d) for d in input_dtypes),
            int(flops), int(hbm_bytes), fallback, kernel_ids, threading.get_ident(), graph_id,
            producers=tuple([op_id - m if m else 0 for m in made_by]),
        ))
    clock.exclude(_perf_ns() - real_start - queued_ns - overhead)
    if host_costs.per_launch_ns:
        clock.defer(-host_costs.per_launch_ns, host_end)
    return op_id


@contextmanager
def device_accounting_suspended() -> Iterator[None]:
    """Ops inside compute their numbers but launch nothing and emit no op events."""
    host_start = clock.now()
    state.suspended_depth += 1
    state.accounting = False
    allocation_context.suspended = True
    try:
        yield
    finally:
        state.suspended_depth -= 1
        state.accounting = state.suspended_depth == 0
        allocation_context.suspended = not state.accounting
        if state.accounting:
            # The ops inside already took their own time off the clock: take off only
            # what is left, so the whole block counts nothing (not its ops twice).
            clock.exclude(clock.now() - host_start)


def synchronize(device_index: int | None, kind: str) -> None:
    """A sync point: flush queued work, then the host waits for the device to finish."""
    real_start, now = clock.stamp()
    queued_ns = state.policy.flush(now)
    targets = devices.devices() if device_index == -1 else [devices.get(device_index)]
    clock.exclude(_perf_ns() - real_start - queued_ns)
    for device in targets:
        host_start = clock.now()
        clock.advance_to(device.timeline.finish_ns)
        if hub.active:
            record_start, now = clock.stamp()
            hub.sync_waited(SyncWait(device.index, kind, host_start, now))
            clock.exclude(_perf_ns() - record_start)

