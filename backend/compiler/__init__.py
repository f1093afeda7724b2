"""The compile path: `torch.compile(model, backend="neuron")`, fused kernels, compile
events, and adaptive eager.

    compiled = torch.compile(model, backend="neuron")   # backend found by entry point
    NEURON_EAGER_MODE=adaptive python train.py          # eager ops fused at sync points

This package's `__init__` stays light (it runs at `import torch` through the device
registration): Dynamo, AOTAutograd and the fusion machinery load on first use.
"""

from __future__ import annotations

from types import ModuleType

from neuron_explorer.backend.compiler import adaptive_mode, inductor_guard


def on_device_registered(device_module: ModuleType) -> None:
    """Called once by the device registration: make the default torch.compile backend
    fail clearly on neuron tensors, and install the eager policy NEURON_EAGER_MODE asks
    for (an unknown mode raises a NeuronExplorerError naming the valid ones)."""
    inductor_guard.install(device_module)
    adaptive_mode.install_from_environment()


__all__ = ["on_device_registered"]
