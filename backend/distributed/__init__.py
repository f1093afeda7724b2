"""torch.distributed on `neuron`: a process-group backend and a simulated interconnect.

`register()` (run when the device loads) registers the "neuron" backend for the
`neuron` device, so `init_process_group("neuron")` and the device-aware default
(`init_process_group()`, "cpu:gloo,neuron:neuron") work, and gives `torch.neuron` the
stream API FSDP2 uses. See `process_group` for how a collective runs.
"""

from __future__ import annotations

import datetime

_registered = False


def _create(store, rank: int, size: int, timeout: datetime.timedelta):
    from neuron_explorer.backend.distributed.process_group import ProcessGroupNeuron

    return ProcessGroupNeuron(store, rank, size, timeout)


def register(device_module) -> None:
    """Register the "neuron" process-group backend (idempotent; cheap when distributed is
    not built in)."""
    global _registered
    if _registered:
        return
    _registered = True
    from neuron_explorer.backend.distributed import storage_resize, streams

    streams.install(device_module)
    storage_resize.install()
    import torch.distributed as dist

    if not dist.is_available():
        return
    dist.Backend.register_backend("neuron", _create, devices=["neuron"])
    from neuron_explorer.backend.distributed import c10d_ops

    c10d_ops.register()
