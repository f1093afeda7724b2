"""Calling a kernel with `neuron` tensors in eager mode: one launch, one kernel.

The inputs' values are read and the outputs written back without device accounting
(they are the kernel's own HBM tensors, not copies a program would make); the kernel
is placed on the device timeline as one op, `nki::<kernel name>`, scheduled on the
device's preset, and its outputs come back as `neuron` tensors.

Host time is charged as a real stack charges it, not as the emulation spends it: the
first call with a new signature (shapes, dtypes, other arguments, preset) compiles the
kernel, shown as a `neuron_compile` span like a graph's; every call then costs one
launch. Tracing and simulating the kernel on later calls is the emulator's work and is
taken off the host clock (docs/recording.md, "What the host clock charges").
"""

from __future__ import annotations

import numpy as np
import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.common.trace_format import ARG_KERNEL_DURATION, ARG_KERNEL_ROTATED
from neuron_explorer.nki.errors import NkiError

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8,
                 "int16": torch.int16, "bool": torch.bool}

# Kernel signatures compiled so far in this process (a real stack's compile cache).
_compiled: set[tuple] = set()


def signature(kernel, args: tuple, kwargs: dict, preset_name: str) -> tuple:
    """What a compiled kernel is specialised on: the function, its launch grid, each
    tensor's shape and dtype, the other arguments' values and the hardware preset."""
    def arg_key(a: object) -> object:
        if isinstance(a, torch.Tensor):
            return ("tensor", tuple(a.shape), str(a.dtype))
        return ("value", repr(a))

    return (kernel.func, tuple(getattr(kernel, "grid", ()) or ()), preset_name,
            tuple(arg_key(a) for a in args),
            tuple(sorted((k, arg_key(v)) for k, v in kwargs.items())))


class HostArg:
    """A kernel argument's values with its own dtype (numpy has no bfloat16)."""

    def __init__(self, values: np.ndarray, dtype: str) -> None:
        self.values, self.dtype, self.shape = values, dtype, values.shape


def launch(kernel, args: tuple, kwargs: dict):
    # Only the launch and a first call's compile are the program's time. The rest is the
    # emulator's, taken off the host clock: checking, keying and copying the inputs,
    # tracing and scheduling the kernel, making the outputs and freeing the trace (left
    # on, they charged a 512x512 layer norm kernel 320 us a call, an aten op's launch 80).
    real = clock.real_ns()
    from neuron_explorer.backend import devices, runtime
    from neuron_explorer.backend.compiler import compile_events
    from neuron_explorer.nki.runner import run

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    places = {a.device for a in tensors}
    if len(places) != 1 or next(iter(places)).type != "neuron":
        raise NkiError(f"{kernel.func.__name__}: kernel tensors must all be on one neuron "
                       f"device, got {sorted(str(p) for p in places)}; move them with "
                       ".to('neuron')")
    device = devices.get(next(iter(places)).index or 0)
    key = signature(kernel, args, kwargs, device.preset.name)
    with runtime.device_accounting_suspended():
        host = [HostArg(to_numpy(a), str(a.dtype).removeprefix("torch."))
                if isinstance(a, torch.Tensor) else a for a in args]
    # the launch's arguments (a neuron tensor's metadata costs a few us a read)
    shapes = [tuple(a.shape) for a in tensors]
    dtypes = [str(a.dtype).removeprefix("torch.") for a in tensors]
    if key in _compiled:
        # the kernel's numbers and schedule are the chip's work: off the host clock
        with runtime.device_accounting_suspended():
            result = run(kernel, tuple(host), kwargs, device.preset, numerics=True)
        _exclude_since(real)
    else:
        _exclude_since(real)
        sizes = ", ".join(str(list(s)) for s in shapes)
        with compile_events.span("neuron_compile", f"nki::{kernel.func.__name__} ({sizes})",
                                 {"kernel": kernel.func.__name__, "phase": "nki",
                                  "sizes": sizes}) as about:
            # the first call's trace and schedule stand for the kernel's compile
            result = run(kernel, tuple(host), kwargs, device.preset, numerics=True)
            about.update(_what_if_rotated(result))
        _compiled.add(key)
    k = result.kernel
    runtime.launch_kernels(device.index, [k], f"nki::{result.name}", shapes, dtypes,
                           k.model_flops, k.hbm_bytes)
    real = clock.real_ns()
    with runtime.device_accounting_suspended():
        outputs = outputs_to_device(result.outputs, result.output_dtypes, next(iter(places)))
    del result, host, k  # freed here, not as the caller's frame returns
    _exclude_since(real)
    return outputs


def _exclude_since(real: int) -> None:
    """Take the real time since `real` (a `clock.real_ns()` reading) off the host clock;
    what was excluded inside it already is not taken off twice (on the modelled clock
    nothing real counts: 0)."""
    clock.exclude(max(clock.real_ns() - real, 0))


def _what_if_rotated(result) -> dict[str, int]:
    """The kernel's length and its length with its SBUF tiles rotated (a fresh buffer per
    write: backend/hardware/rotated.py), for the DMA-pipelining finding. Scheduling it
    again is the analysis's work, not the kernel's compile: off the host clock."""
    from neuron_explorer.backend.hardware.rotated import rotated_length_ns

    if result.builder is None:
        return {}
    real = clock.real_ns()
    rotated = rotated_length_ns(result.builder)
    clock.exclude(clock.real_ns() - real)
    return {ARG_KERNEL_DURATION: int(result.kernel.duration_ns), ARG_KERNEL_ROTATED: rotated}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.float()
    return t.numpy()


def outputs_to_device(out, dts, place):
    if isinstance(out, (tuple, list)):
        return type(out)(outputs_to_device(o, d, place) for o, d in zip(out, dts, strict=True))
    if isinstance(out, np.ndarray):
        dtype = _TORCH_DTYPES.get(dts, torch.float32)
        return torch.from_numpy(np.ascontiguousarray(out)).to(dtype).to(place)
    return out
