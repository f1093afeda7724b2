"""`Module.to("neuron")` keeps each parameter the same object, as a move to a built-in device does.

`Module._apply` changes a parameter in place (`param.data = moved`) only when PyTorch
allows a shallow copy between the two tensor types, which it grants to its built-in
devices alone. Between the host and `neuron` it puts a new Parameter in each module's
slot instead, so a parameter shared by two modules (an embedding tied to the output
head) became two parameters that trained apart, and an optimizer built before the move
kept updating the host copies. After each conversion, every parameter that changed
object gets its moved data swapped into the original object (`torch.utils.swap_tensors`),
which goes back into every slot that held it.
"""

from __future__ import annotations

from typing import Any

import torch


def _keep_identity(original: torch.nn.Parameter, moved: torch.nn.Parameter) -> torch.nn.Parameter:
    """`original` holding `moved`'s data, or `moved` when the swap is refused (a weak
    reference to the parameter, or another holder of its tensor)."""
    try:
        torch.utils.swap_tensors(original, moved)
    except RuntimeError:
        return moved
    # swap_tensors exchanges the Python attributes too: the user's stay with their object
    original.__dict__, moved.__dict__ = moved.__dict__, original.__dict__
    return original


def install() -> None:
    """Wrap `torch.nn.Module._apply` (behind `to`, `cpu`, `neuron`, `half`, ...) once."""
    base_apply = torch.nn.Module._apply
    if getattr(base_apply, "_neuron_keeps_identity", False):
        return

    def _apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        # Each module's own parameters are put back right after its conversion, before a
        # later holder of a shared one converts it again and before an override such as
        # RNNBase._apply caches the converted ones.
        before = [(name, param) for name, param in self._parameters.items() if param is not None]
        result = base_apply(self, fn, recurse)
        params = self._parameters
        for name, original in before:
            moved = params.get(name)
            if moved is not None and moved is not original:
                params[name] = _keep_identity(original, moved)
        return result

    _apply._neuron_keeps_identity = True  # type: ignore[attr-defined]
    torch.nn.Module._apply = _apply  # type: ignore[method-assign]  # parameters keep identity
