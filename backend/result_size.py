"""The size of an op's result, known before the host computes it, checked against free HBM.

A neuron result is computed in host memory and only then counted against the device's
HBM, so a result that cannot fit would first cost its whole size in host RAM (an outer
product of two 60000-vectors: 14 GB and a minute) before `OutOfMemoryError`. Here each
op gets a rule, chosen once from its schema and tags, that bounds the result's bytes
from the input shapes alone:

- pointwise ops: the broadcast of the inputs' shapes, at 1 to 16 bytes per element;
- the matmul family (mm, addmm, bmm, baddbmm) and cat: exact from the shapes;
- factory ops (no device input) and out= ops (which may resize their output), and any
  other op whose inputs are large next to the free HBM: the op's Meta kernel, run on
  meta copies of the inputs (exact; skipped for ops without one or whose result size
  depends on data).

A bound that cannot fit raises at once; a bound that surely fits costs nothing more;
between the two, the Meta kernel decides. The cheap rules are what the hot path pays.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from neuron_explorer.backend.allocator import out_of_memory

_Tensor = torch.Tensor
MAX_ITEMSIZE = 16  # complex128
_META = torch.device("meta")

Rule = Callable[[object, object, list, tuple, dict], None]


def _free(device) -> int:
    memory = device.memory
    return memory.capacity - memory.in_use


def _refuse(device, nbytes: int) -> None:
    raise out_of_memory(device.memory, nbytes)


def _to_meta(value):
    if isinstance(value, _Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_META)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, torch.device):
        return _META
    if isinstance(value, torch.Generator):
        return None
    return value


def _tensors(value) -> list[_Tensor]:
    if isinstance(value, _Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def meta_result_bytes(info, args: tuple, kwargs: dict) -> int | None:
    """Bytes of the op's result (the out= tensors' new storage for out= ops), from its Meta
    kernel on meta copies of the arguments; None where the Meta kernel cannot say."""
    meta_args = [_to_meta(a) for a in args]
    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    try:
        result = info.call(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - no Meta kernel, or a data-dependent size
        return None
    if info.out_args:
        written = [meta_kwargs[name] for name in info.out_args if name in meta_kwargs]
        olds = [kwargs[name] for name in info.out_args if name in kwargs]
        return sum(_storage_bytes(new)
                   for new, old in zip(_tensors(written), _tensors(olds), strict=True)
                   if _storage_bytes(new) > old.untyped_storage().nbytes())
    return sum(_storage_bytes(t) for t in _tensors(result))


def _storage_bytes(t: _Tensor) -> int:
    if not t.numel():
        return 0
    return ((1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)))
            * t.element_size())


def _check_window(device, info, args, kwargs, numel: int, dtype: torch.dtype | None) -> None:
    """Refuse `numel` elements that cannot fit: of `dtype`, or when it is unknown, of the
    dtype the same op gives on one-element host tensors (asked only when the answer
    matters: neither 1 nor 16 bytes per element settle it)."""
    free = _free(device)
    if dtype is None:
        if numel * MAX_ITEMSIZE <= free:
            return
        dtype = _result_dtype(info, args, kwargs)
        if dtype is None:
            if numel > free:
                _refuse(device, numel)
            return
    nbytes = numel * dtype.itemsize
    if nbytes > free:
        _refuse(device, nbytes)


def _tiny(value):
    if isinstance(value, _Tensor):
        return torch.ones((), dtype=value.dtype)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], _Tensor):
        return [_tiny(v) for v in value]
    return value


def _result_dtype(info, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype of the op's first result on one-element host tensors (None if it fails)."""
    try:
        result = info.call(*[_tiny(a) for a in args],
                           **{k: _tiny(v) for k, v in kwargs.items() if k != "device"})
    except Exception:  # noqa: BLE001 - the op refuses ones: the caller falls back
        return None
    tensors = _tensors(result)
    return tensors[0].dtype if tensors else None


def _broadcast_numel(sig: list) -> int:
    """Elements of the inputs' broadcast shape (torch.broadcast_shapes would import much
    of torch._refs on first use: seconds)."""
    shape = sig[0][0]
    if all(other == shape for other, _ in sig):
        return shape.numel()
    rank = max(len(s) for s, _ in sig)
    numel = 1
    for dim in range(1, rank + 1):
        numel *= max((s[-dim] for s, _ in sig if len(s) >= dim), default=1)
    return numel


def _arg(info, args: tuple, kwargs: dict, name: str, default=None):
    """An argument's value by name, given positionally or by keyword."""
    i = info.arg_names.index(name)
    if i < len(args):
        return args[i]
    return kwargs.get(name, default)


# Each rule: (elements of the result, its dtype or None when only the op knows it).
def _pointwise(info, sig, args, kwargs):
    return _broadcast_numel(sig), None


def _concatenated(info, sig, args, kwargs):
    return sum(shape.numel() for shape, _ in sig), None


def _matrix_product(info, sig, args, kwargs):
    """mm, bmm, addmm, baddbmm: the last two inputs are the matrices."""
    (a, dtype), (b, _) = sig[-2:]
    if not 2 <= len(a) == len(b) <= 3:
        return 0, dtype  # a bad rank: the op's own error says so
    return a[-2] * b[-1] * (a[0] if len(a) == 3 else 1), dtype


def _embedding(info, sig, args, kwargs):
    (weight, dtype), (indices, _) = sig[:2]
    return indices.numel() * weight[-1], dtype


def _repeat(info, sig, args, kwargs):
    numel = sig[0][0].numel()
    for n in _arg(info, args, kwargs, "repeats"):
        numel *= n
    return numel, sig[0][1]


def _index_select(info, sig, args, kwargs):
    (shape, dtype), (index, _) = sig[:2]
    dim = _arg(info, args, kwargs, "dim")
    return (shape.numel() // shape[dim] if shape[dim] else 0) * index.numel(), dtype


def _gather(info, sig, args, kwargs):
    return sig[1][0].numel(), sig[0][1]


def _padded(info, sig, args, kwargs):
    shape, dtype = sig[0]
    sizes = list(shape)
    pad = _arg(info, args, kwargs, "pad")
    for i in range(len(pad) // 2):
        sizes[-1 - i] += pad[2 * i] + pad[2 * i + 1]
    numel = 1
    for n in sizes:
        numel *= max(n, 0)
    return numel, dtype


def _arange(info, sig, args, kwargs):
    start, end = _arg(info, args, kwargs, "start", 0), _arg(info, args, kwargs, "end")
    step = _arg(info, args, kwargs, "step", 1)
    if step == 0 or (end - start) / step <= 0:
        return 0, None  # the op's own error
    return math.ceil((end - start) / step), None


def _steps(info, sig, args, kwargs):
    return max(int(_arg(info, args, kwargs, "steps")), 0), None


_RULES = {
    "aten::mm": _matrix_product, "aten::bmm": _matrix_product, "aten::addmm": _matrix_product,
    "aten::baddbmm": _matrix_product, "aten::cat": _concatenated,
    "aten::stack": _concatenated, "aten::embedding": _embedding, "aten::repeat": _repeat,
    "aten::index_select": _index_select, "aten::gather": _gather,
    "aten::constant_pad_nd": _padded, "aten::arange": _arange, "aten::linspace": _steps,
    "aten::logspace": _steps,
}


def _checker(rule, n_out: int):
    def check(info, device, sig: list, args: tuple, kwargs: dict) -> None:
        inputs = sig[:-n_out] if n_out else sig
        if not inputs and rule not in (_arange, _steps):
            return
        try:
            numel, dtype = rule(info, inputs, args, kwargs)
        except (IndexError, TypeError, ValueError, ZeroDivisionError):
            return  # arguments the op itself refuses, with its own error
        if n_out and dtype is None:
            dtype = sig[-1][1]  # an out= tensor keeps its dtype
        _check_window(device, info, args, kwargs, numel, dtype)

    return check


def by_meta(info, device, sig: list, args: tuple, kwargs: dict) -> None:
    """Any other op: its Meta kernel says, when the inputs (or for a factory, its size
    arguments) are large enough next to the free HBM for the result not to fit: Meta
    kernels written in Python import much of torch on first use (seconds), so they are
    not asked about small tensors."""
    free = _free(device)
    largest = max((shape.numel() for shape, _ in sig), default=0)
    for value in (*args, *kwargs.values()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            largest = max(largest, abs(value))
        elif isinstance(value, (list, tuple)) and value and type(value[0]) is int:
            largest = max(largest, math.prod(value))
    if largest * MAX_ITEMSIZE <= free:
        return
    nbytes = meta_result_bytes(info, args, kwargs)
    if nbytes is not None and nbytes > free:
        _refuse(device, nbytes)


def numel_of_nonzero_dims(shape) -> int:
    """Elements of `shape` with its zero sizes read as 1 (an (n, 0) @ (0, m) product has
    n * m elements: a zero-size input does not bound the result)."""
    numel = 1
    for n in shape:
        numel *= n or 1
    return numel


def bounded_by_inputs(op: torch._ops.OpOverload) -> bool:
    """Whether the product of the inputs' sizes (zero sizes read as 1) bounds the result's
    elements: true of broadcasts, matrix products and of most other ops, not of those
    whose sizes come from their arguments (repeat, pad, arange...) or that join inputs."""
    return op._schema.name not in _RULES or _RULES[op._schema.name] is _matrix_product


def rule_for(op: torch._ops.OpOverload, functional: bool, out_args: tuple) -> Rule | None:
    """The size check of `op` (None for in-place ops, whose result is their input)."""
    if not functional and not out_args:
        return None
    rule = _RULES.get(op._schema.name)
    if rule is None and torch.Tag.pointwise in op.tags:
        rule = _pointwise
    return by_meta if rule is None else _checker(rule, len(out_args))


def check_host_to_device(device, numel: int, dtype: torch.dtype) -> None:
    """`.to("neuron")` and dtype changes: refuse before the host makes its copy."""
    nbytes = numel * dtype.itemsize
    if nbytes > _free(device):
        _refuse(device, nbytes)
