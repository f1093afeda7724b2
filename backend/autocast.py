"""`torch.autocast("neuron", dtype=...)`: the cast rules PyTorch has for CUDA, for neuron.

PyTorch registers no autocast kernels for PrivateUse1, so these Python kernels on the
AutocastPrivateUse1 key cast floating-point neuron tensors to the autocast dtype for
matmul-like ops, and to float32 for ops that need the range (softmax, losses, norms),
then run the op below the autocast key (the lists: common/autocast_policy.py). Every
other op falls through.
"""

from __future__ import annotations

import torch
from neuron_explorer.backend.matmul_numerics import attention_in_input_dtype
from neuron_explorer.common.autocast_policy import FLOAT32, LOWER_PRECISION
from torch._C import DispatchKey, DispatchKeySet

# present at run time; torch's stubs do not list it
_AUTOCAST_KEYS = DispatchKeySet(DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined]
_exclude = torch._C._ExcludeDispatchKeyGuard


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype != dtype and value.device.type == "neuron":
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _lower_precision_kernel(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("neuron")
        with _exclude(_AUTOCAST_KEYS):
            args = tuple(_cast(a, dtype) for a in args)
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def _attention_kernel(op):
    """SDPA in the autocast dtype. Its math decomposition would upcast bf16/fp16 inputs to
    fp32 (PyTorch keeps reduced-precision reductions off by default), so the batched
    matmuls would run at the Tensor Engine's FP32 rate; the chip multiplies them in bf16
    and accumulates in fp32 (PSUM), so the reduced-precision path is allowed here."""
    lower = _lower_precision_kernel(op)

    def kernel(*args, **kwargs):
        with attention_in_input_dtype():
            return lower(*args, **kwargs)

    return kernel


def _float32_kernel(op):
    def kernel(*args, **kwargs):
        with _exclude(_AUTOCAST_KEYS):
            args = tuple(_cast(a, torch.float32) for a in args)
            kwargs = {k: _cast(v, torch.float32) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def _overload(name: str):
    packet, _, overload = name.partition(".")
    packet_obj = getattr(torch.ops.aten, packet, None)
    if packet_obj is None:
        return None
    return getattr(packet_obj, overload or "default", None)


def register(lib: torch.library.Library) -> None:
    """Register the autocast kernels on `lib` (an aten IMPL library)."""
    for names, make in ((LOWER_PRECISION, _lower_precision_kernel), (FLOAT32, _float32_kernel)):
        for name in names:
            op = _overload(name)
            if op is not None:
                wrap = _attention_kernel if name == "scaled_dot_product_attention" else make
                lib.impl(name, wrap(op), "AutocastPrivateUse1")
