"""`UntypedStorage.resize_` for `neuron` storages, which FSDP2 uses to free and refill the
unsharded parameters between uses (views of the storage keep seeing its memory).

PyTorch resizes a PrivateUse1 storage through a C++ hook that pure Python cannot
register, so the resize is done here: a new device allocation of the new size (the
kept prefix copied over) takes the storage's place with `_swap_data_ptr_`, and the old
memory is released with the block that owned it.
"""

from __future__ import annotations

import torch

_installed = False


def _resize_neuron(storage: torch.UntypedStorage, nbytes: int) -> torch.UntypedStorage:
    from neuron_explorer.backend import devices
    from neuron_explorer.backend.allocator import allocate, block_of, swap_blocks

    device = devices.get(storage.device.index)
    replacement = allocate(device.memory, int(nbytes), device.torch_device)
    keep = min(int(nbytes), storage.nbytes())
    if keep:
        old_host = block_of(storage).host
        block_of(replacement).host[:keep].copy_(old_host[:keep])
    storage._swap_data_ptr_(replacement)  # type: ignore[attr-defined]  # in torch, not its stubs
    swap_blocks(storage, replacement)
    return storage  # `replacement` now holds the old memory; dropping it frees it


def install() -> None:
    """Route `resize_` of neuron storages here (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    base_resize = torch.UntypedStorage.resize_

    def resize_(self, size):
        if self.device.type == "neuron":
            return _resize_neuron(self, size)
        return base_resize(self, size)

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]  # neuron storages
