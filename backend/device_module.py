"""`torch.neuron`: the device module, shaped like `torch.cuda` where it makes sense.

Device selection, synchronisation, random state and memory statistics of the
simulated NeuronCores. Registered with `torch._register_device_module("neuron", ...)`.

A bare "neuron" (no index) means the current device (`set_device`) wherever the
index reaches our kernels: factories (`torch.empty/zeros/randn(..., device="neuron")`)
and `Tensor.neuron()`. It does not for `Tensor.to("neuron")`, `Module.to("neuron")`
and `torch.tensor(..., device="neuron")`: PyTorch fills the missing index in C++ from
the device guard's `getDevice()`, and the Python-registered guard
(`torch._C._acc.DeviceGuard`, torch 2.13) forwards only `type_` to Python; its
`getDevice`/`exchangeDevice` always answer index 0. Those calls land on neuron:0, so
name the index (`.to(f"neuron:{torch.neuron.current_device()}")`) to reach another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from neuron_explorer.backend import devices, runtime

_DeviceLike = int | str | torch.device | None


def _index(device: _DeviceLike) -> int:
    """Device index of `device` (the current device for None or a bare "neuron")."""
    if device is None:
        return devices.current_index
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"expected a neuron device, got {device}")
    return devices.current_index if device.index is None else device.index


def is_available() -> bool:
    """The simulated device is always there."""
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    devices.devices()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes `torch.autocast("neuron", dtype=...)` accepts."""
    return [torch.bfloat16, torch.float16]


def device_count() -> int:
    """NeuronCores on the simulated chip (one `neuron` device each)."""
    return devices.device_count()


def current_device() -> int:
    return devices.current_index


def set_device(device: _DeviceLike) -> None:
    devices.set_current(_index(device))


class device:
    """Context manager that makes `device` current, as `torch.cuda.device` does."""

    def __init__(self, device: _DeviceLike) -> None:
        self.index = _index(device)
        self.previous = devices.current_index

    def __enter__(self) -> None:
        self.previous = devices.current_index
        devices.set_current(self.index)

    def __exit__(self, *exc: object) -> None:
        devices.set_current(self.previous)


def synchronize(device: _DeviceLike = None) -> None:
    """Make the host wait until the device has finished all launched work."""
    runtime.synchronize(_index(device), "synchronize")


# --- random state ------------------------------------------------------------------

def manual_seed(seed: int) -> None:
    """Seed the current device's random stream."""
    devices.get(None).generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's random stream (`torch.manual_seed` calls this).

    Before the devices exist the seed is kept for them, so that seeding never needs the
    hardware preset (a CPU-only program with a bad NEURON_HARDWARE still seeds)."""
    if not devices.initialized():
        devices.pending_seed = int(seed)
        return
    for dev in devices.devices():
        dev.generator.manual_seed(int(seed))


def seed() -> None:
    devices.get(None).generator.seed()


def seed_all() -> None:
    for dev in devices.devices():
        dev.generator.seed()


def initial_seed() -> int:
    return devices.get(None).generator.initial_seed()


def get_rng_state(device: _DeviceLike = "neuron") -> torch.Tensor:
    """The device's random state as a CPU ByteTensor."""
    return devices.get(_index(device)).generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "neuron") -> None:
    devices.get(_index(device)).generator.set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    return [dev.generator.get_state() for dev in devices.devices()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    # As torch.cuda: fewer states than devices set the first devices only.
    for dev, state in zip(devices.devices(), new_states, strict=False):
        dev.generator.set_state(state.cpu())


# --- memory ---------------------------------------------------------------------------

def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by live tensors on the device."""
    return devices.get(_index(device)).memory.in_use


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """Peak of `memory_allocated` since the start or the last reset."""
    return devices.get(_index(device)).memory.peak


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    stats = devices.get(_index(device)).memory
    stats.peak = stats.in_use


def memory_stats(device: _DeviceLike = None) -> dict[str, int]:
    """CUDA-style counters (`allocated_bytes.all.current`, ...)."""
    return devices.get(_index(device)).memory.as_dict()


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device's HBM share."""
    stats = devices.get(_index(device)).memory
    return stats.capacity - stats.in_use, stats.capacity


def empty_cache() -> None:
    """Nothing is cached: freed tensors return their memory at once."""


# --- identity -------------------------------------------------------------------------

def get_device_name(device: _DeviceLike = None) -> str:
    """E.g. "Trainium2 NeuronCore-v3 (simulated)"."""
    preset = devices.get(_index(device)).preset
    return f"{preset.chip_name} {preset.core_name} (simulated)"


@dataclass(frozen=True)
class NeuronDeviceProperties:
    """What `get_device_properties` reports, like CUDA's: name, memory, and the figures."""

    name: str
    total_memory: int
    preset: str
    cores_per_chip: int
    figures: dict[str, Any] = field(repr=False)

    def __getattr__(self, item: str) -> Any:
        figures = object.__getattribute__(self, "figures")
        if item in figures:
            return figures[item]
        raise AttributeError(item)


def get_device_properties(device: _DeviceLike = None) -> NeuronDeviceProperties:
    dev = devices.get(_index(device))
    preset = dev.preset
    return NeuronDeviceProperties(
        name=get_device_name(dev.index),
        total_memory=dev.memory.capacity,
        preset=preset.name,
        cores_per_chip=preset.cores_per_chip,
        figures=preset.figures(),
    )


def get_device_capability(device: _DeviceLike = None) -> tuple[int, int]:
    """NeuronCore generation, e.g. (3, 0) for NeuronCore-v3."""
    core = devices.get(_index(device)).preset.core_name
    digits = "".join(ch for ch in core.rsplit("v", 1)[-1] if ch.isdigit())
    return (int(digits or 0), 0)
