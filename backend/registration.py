"""Registers the `neuron` device with PyTorch, in one place, separate from the kernels.

`register()` renames PrivateUse1 to "neuron", installs `torch.neuron`, the Python
device guard and hooks, the boxed fallback and the explicit kernels, and a few
small wrappers for what pure Python cannot otherwise reach (storage allocation by
`torch.UntypedStorage(n, device=...)`, the sync kind of printing and `tolist`,
DataLoader's `pin_memory`, and `Module.to` keeping each parameter the same object).
It imports no pandas, DuckDB or Dash and stays cheap, because `import torch` runs it.
"""

from __future__ import annotations

import warnings

import torch

_registered = False
_libraries: list[torch.library.Library] = []  # kept alive: dropping one unregisters it


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


# Classes whose Python methods C++ calls (device guards, hooks) where a Python exception
# cannot propagate: a Ctrl-C raised there aborted the process. The recorder's signal
# guard sends such a signal again a moment later instead (collectors/signal_guard.py).
CALLED_FROM_NATIVE = (_Hooks, _Guard)


def _wrap_storage_new() -> None:
    """`torch.UntypedStorage(n, device="neuron")` (deepcopy, storage.to, load) allocates here."""
    from neuron_explorer.backend import devices
    from neuron_explorer.backend.allocator import allocate

    base_new = torch._C.StorageBase.__new__

    def __new__(cls, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "neuron" and cls is \
                torch.UntypedStorage and len(args) == 1 and isinstance(args[0], int):
            dev = devices.get(torch.device(device).index)
            return allocate(dev.memory, args[0], dev.torch_device)
        if device is not None:
            kwargs["device"] = device
        return base_new(cls, *args, **kwargs)

    torch.UntypedStorage.__new__ = __new__  # type: ignore[method-assign]  # neuron storages


def _holds_no_device_data(t: torch.Tensor) -> bool:
    """A compiler's stand-in (a FakeTensor, symbolic sizes): printing reads no device memory."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or any(isinstance(n, torch.SymInt) for n in t.shape)


def _wrap_sync_kinds() -> None:
    """Name the sync point when printing or `tolist` makes the host read a neuron tensor."""
    from neuron_explorer.backend.kernels import read_to_host, sync_kind
    from neuron_explorer.backend.runtime import device_accounting_suspended

    tensor_str = torch._tensor_str
    base_str = tensor_str._str
    base_tolist = torch.Tensor.tolist

    def _str(self, *, tensor_contents=None):
        if self.device.type != "neuron" or _holds_no_device_data(self):
            return base_str(self, tensor_contents=tensor_contents)
        # Printing reads the whole tensor once; the formatting ops are not the program's.
        read_to_host(self, "print")
        with device_accounting_suspended():
            return base_str(self, tensor_contents=tensor_contents)

    def tolist(self):
        if self.device.type != "neuron":
            return base_tolist(self)
        sync_kind.append("tolist")
        try:
            return base_tolist(self)
        finally:
            sync_kind.pop()

    tensor_str._str = _str
    torch.Tensor.tolist = tolist  # type: ignore[method-assign]  # counts the sync it does


def _wrap_dataloader_pin_memory() -> None:
    """DataLoader(pin_memory=True): warn once and load unpinned (no pinned host memory here)."""
    from torch.utils.data import dataloader

    base_init = dataloader._BaseDataLoaderIter.__init__
    warned: list[bool] = []

    def __init__(self, loader) -> None:
        if loader.pin_memory and torch.accelerator.current_accelerator() == \
                torch.device("neuron") and loader.pin_memory_device in ("", "neuron"):
            if not warned:
                warned.append(True)
                warnings.warn(
                    "DataLoader(pin_memory=True): the neuron device has no pinned host memory; "
                    "batches are loaded unpinned (set pin_memory=False to silence this)",
                    stacklevel=3,
                )
            base_init(self, loader)
            self._pin_memory = False
            return
        base_init(self, loader)

    dataloader._BaseDataLoaderIter.__init__ = __init__  # type: ignore[method-assign]  # unpinned


def hide_from_dynamo() -> None:
    """Stop Dynamo from compiling the device's Python code, the kernels it reaches from C++
    and all they call (again for modules loaded since; see compiler/dynamo_skip.py)."""
    from neuron_explorer.backend.compiler.dynamo_skip import skip_backend_frames

    skip_backend_frames()


def register() -> None:
    """Make `torch.device("neuron")` work (idempotent)."""
    global _registered
    if _registered:
        return
    _registered = True
    from neuron_explorer.backend import (
        accelerator_api,
        autocast,
        device_module,
        dispatch,
        kernels,
        module_conversion,
        rnn_cells,
    )

    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True
    )
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())

    fallbacks = torch.library.Library("_", "IMPL")
    fallbacks.fallback(dispatch.fallback, "PrivateUse1")
    fallbacks.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    kernels.register(aten)
    rnn_cells.register(aten)
    autocast.register(aten)
    _libraries.extend((fallbacks, aten))

    # Backward on a Python device otherwise hands every node to a device thread.
    torch.autograd.set_multithreading_enabled(False)
    _wrap_storage_new()
    _wrap_sync_kinds()
    _wrap_dataloader_pin_memory()
    module_conversion.install()  # Module.to("neuron") keeps each parameter the same object
    accelerator_api.install()  # torch.accelerator.synchronize() and memory stats: ours

    # The compile path: the default torch.compile backend fails clearly on neuron
    # tensors, and NEURON_EAGER_MODE picks the eager policy (immediate or adaptive).
    from neuron_explorer.backend.compiler import on_device_registered

    on_device_registered(device_module)

    # torch.distributed: the "neuron" process-group backend and torch.neuron's streams.
    from neuron_explorer.backend.distributed import register as register_distributed

    register_distributed(device_module)

    # Under torch.compile (any backend), a compiled function's code outside its graphs
    # reaches the kernels above: Dynamo must run them, and all they call, as they are.
    hide_from_dynamo()
