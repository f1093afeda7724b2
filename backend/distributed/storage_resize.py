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
    from neuron_explorer.backend.allocator import allocate, block_of

    nbytes = int(nbytes)
    if nbytes == storage.nbytes():
        return storage
    device = devices.get(storage.device.index)
    replacement = allocate(device.memory, nbytes, device.torch_device)
    keep = min(nbytes, storage.nbytes())
    if keep:
        old_host = block_of(storage).host
        block_of(replacement).host[:keep].copy_(old_host[:keep])
    if storage.nbytes() and nbytes:
        # torch swaps only storages of one size, or with an empty one: empty this one first
        empty = allocate(device.memory, 0, device.torch_device)
        _swap(storage, empty)  # `empty` now holds the old memory; dropping it frees it
    _swap(storage, replacement)
    return storage  # `replacement` now holds the old (or the empty) memory


def _swap(storage: torch.UntypedStorage, other: torch.UntypedStorage) -> None:
    """Exchange the memory of two neuron storages, and the blocks that account for it."""
    from neuron_explorer.backend.allocator import swap_blocks

    storage._swap_data_ptr_(other)  # type: ignore[attr-defined]  # in torch, not its stubs
    swap_blocks(storage, other)


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
