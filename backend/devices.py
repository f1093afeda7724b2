"""The simulated NeuronCores: one `neuron` device per core of one chip of the chosen preset.

The preset comes from `NEURON_HARDWARE` (a name in common/presets.py; trn2 by default) and is
resolved on first use, not at `import torch`, so a bad value is reported where the
device is used, as one clear error.
"""

from __future__ import annotations

import os

import torch
from neuron_explorer.backend.allocator import MemoryStats
from neuron_explorer.common.errors import NeuronExplorerError

PRESET_ENV = "NEURON_HARDWARE"


class UnknownHardwareError(NeuronExplorerError):
    """`NEURON_HARDWARE` names no known preset."""


class NeuronDevice:
    """One NeuronCore: its timeline, its HBM share and its random generator."""

    __slots__ = ("generator", "index", "memory", "preset", "timeline", "torch_device")

    def __init__(self, index: int, preset) -> None:
        from neuron_explorer.backend.hardware import DeviceTimeline

        self.index = index
        self.torch_device = torch.device("neuron", index)
        self.preset = preset
        self.timeline = DeviceTimeline(preset)
        self.memory = MemoryStats(index, _hbm_share(preset))
        # Random ops on this device draw from their own stream, as on CUDA.
        self.generator = torch.Generator()
        self.generator.manual_seed(pending_seed if pending_seed is not None
                                   else torch.initial_seed())


def _hbm_share(preset) -> int:
    """This core's share of the chip's HBM."""
    share = getattr(preset, "hbm_bytes_per_core", None)
    return int(share if share is not None else preset.hbm_bytes)


_devices: list[NeuronDevice] = []
_preset = None
current_index = 0
pending_seed: int | None = None  # seed given before the devices existed


def initialized() -> bool:
    """Whether the devices (and so the preset) have been set up."""
    return bool(_devices)


def preset_name() -> str:
    """The preset asked for in the environment (not yet validated)."""
    from neuron_explorer.common.presets import DEFAULT_PRESET

    return os.environ.get(PRESET_ENV, DEFAULT_PRESET).strip() or DEFAULT_PRESET


def preset():
    """The hardware preset of this process's chip (resolved once)."""
    global _preset
    if _preset is None:
        from neuron_explorer.common.presets import (
            DEFAULT_PRESET,
            PRESETS,
            UnknownPresetError,
            get_preset,
        )

        name = preset_name()
        try:
            _preset = get_preset(name)
        except UnknownPresetError:
            raise UnknownHardwareError(
                f"unknown hardware preset {name!r} in {PRESET_ENV}: "
                f"set {PRESET_ENV} to one of {', '.join(PRESETS)} "
                f"(or unset it for {DEFAULT_PRESET})"
            ) from None
    return _preset


def devices() -> list[NeuronDevice]:
    """All devices of the chip, created on first use."""
    if not _devices:
        chip = preset()
        _devices.extend(NeuronDevice(i, chip) for i in range(chip.cores_per_chip))
    return _devices


def restart_clocks() -> None:
    """Every device idle at host time 0, for a host clock restarted there (a modelled
    recording starts at 0). Work queued before, timed on the old clock, would otherwise
    lie up to the whole run so far in the new clock's future, and the first wait for the
    device would stand still that long (1.86 s after a 20-step warm-up)."""
    from neuron_explorer.backend.distributed import collective_queue

    for device in _devices:
        device.timeline.restart()
    collective_queue.restart()


def device_count() -> int:
    """Number of NeuronCores on the simulated chip."""
    return len(devices())


def get(index: int | None) -> NeuronDevice:
    """The device with this index (the current device for None), or a clear error."""
    all_devices = _devices or devices()
    if index is None:
        index = current_index
    if not 0 <= index < len(all_devices):
        raise RuntimeError(
            f"neuron:{index} does not exist: the {preset().name} preset has "
            f"{len(all_devices)} NeuronCores (neuron:0 to neuron:{len(all_devices) - 1})"
        )
    return all_devices[index]


def set_current(index: int) -> None:
    """Make `index` the device that `"neuron"` without an index means."""
    global current_index
    get(index)
    current_index = index
