"""The `neuron` PyTorch device: a simulated NeuronCore behind the PrivateUse1 mechanism.

`autoload` is the `torch.backends` entry point: `import torch` calls it, so
`torch.device("neuron")` works with no other import
(`TORCH_DEVICE_BACKEND_AUTOLOAD=0` turns that off).
"""

from __future__ import annotations


def autoload() -> None:
    """Register the `neuron` device with PyTorch (idempotent)."""
    from neuron_explorer.backend.registration import register

    register()
