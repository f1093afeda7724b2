"""The simulated NeuronCore: hardware presets, op lowering to engine instructions, and
the cost model that times them on the device clock.

    preset = get_preset("trn2")
    kernel = lower_op(OpSpec("aten::mm", inputs=(...), outputs=(...)), preset)
    start, end = DeviceTimeline(preset).schedule(kernel, launch_ns)
"""

from __future__ import annotations

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.gemm import Gemm, emit_gemm
from neuron_explorer.backend.hardware.kernel import ENGINE_NAMES, Kernel
from neuron_explorer.backend.hardware.lowering import (
    NoLowering,
    clear_cache,
    lower_host_fallback,
    lower_host_transfer,
    lower_op,
)
from neuron_explorer.backend.hardware.optable import HOST_ONLY, LOWERINGS, NO_DEVICE_WORK
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.timeline import DeviceTimeline
from neuron_explorer.common.presets import (
    PRESETS,
    HardwarePreset,
    UnknownPresetError,
    get_preset,
)

__all__ = [
    "ENGINE_NAMES",
    "HOST_ONLY",
    "LOWERINGS",
    "NO_DEVICE_WORK",
    "PRESETS",
    "DeviceTimeline",
    "Gemm",
    "HardwarePreset",
    "Kernel",
    "KernelBuilder",
    "NoLowering",
    "OpSpec",
    "TensorSpec",
    "UnknownPresetError",
    "clear_cache",
    "emit_gemm",
    "get_preset",
    "lower_host_fallback",
    "lower_host_transfer",
    "lower_op",
]
