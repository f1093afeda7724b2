"""`torch.accelerator`'s device-wide calls, answered by `torch.neuron` for the neuron device.

PyTorch routes `torch.accelerator.synchronize()` and the memory statistics to the
accelerator's C++ device guard and caching allocator; a device registered from Python
has neither (its guard forwards only `type_`), so they raised "Backend doesn't support
synchronizing all streams" or an INTERNAL ASSERT. Device-agnostic code is written against
`torch.accelerator`: while the current accelerator is neuron, each of these calls the
device module's function of the same meaning; for any other accelerator they are PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from neuron_explorer.backend import device_module, devices

_DeviceLike = device_module._DeviceLike


def memory_reserved(device: _DeviceLike = None) -> int:
    """Nothing is cached: the bytes reserved are the bytes tensors hold."""
    return device_module.memory_allocated(device)


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return device_module.max_memory_allocated(device)


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    """Zero the counters that only grow (bytes and allocations made and freed, OOMs); the
    live allocations stay counted."""
    stats = devices.get(device_module._index(device)).memory
    stats.alloc_count -= stats.free_count
    stats.free_count = 0
    stats.allocated_total = stats.freed_total = stats.oom_count = 0


# torch.accelerator's name -> what answers it for the neuron device
ANSWERS: dict[str, Callable[..., Any]] = {
    "synchronize": device_module.synchronize,
    "memory_allocated": device_module.memory_allocated,
    "max_memory_allocated": device_module.max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "memory_stats": device_module.memory_stats,
    "reset_peak_memory_stats": device_module.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "get_memory_info": device_module.mem_get_info,
    "empty_cache": lambda: device_module.empty_cache(),
}


def _routed(name: str, torch_own: Callable[..., Any]) -> Callable[..., Any]:
    answer = ANSWERS[name]

    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.accelerator.current_accelerator(check_available=False) != \
                torch.device("neuron"):
            return torch_own(*args, **kwargs)
        if name == "empty_cache":
            return answer()
        return answer(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = torch_own.__doc__
    return call


def install() -> None:
    """Route the calls, where `torch.accelerator` and its `memory` module define them."""
    modules = [torch.accelerator, getattr(torch.accelerator, "memory", None)]
    for name in ANSWERS:
        for module in modules:
            torch_own = getattr(module, name, None)
            if torch_own is not None and not hasattr(torch_own, "_neuron_routed"):
                routed = _routed(name, torch_own)
                routed._neuron_routed = True  # type: ignore[attr-defined]
                setattr(module, name, routed)
