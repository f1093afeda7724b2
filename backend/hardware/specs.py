"""What an op asks of the device: tensor shapes, dtypes and attributes, hashable.

An `OpSpec` is the cache key of a lowered kernel, so it hashes once at
construction and compares cheaply; attribute dicts are frozen into sorted tuples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, Self

from neuron_explorer.common.dtypes import dtype_bytes


class TensorSpec(NamedTuple):
    """Shape and dtype of one tensor an op reads or writes."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_bytes(self.dtype)


_PLAIN = frozenset({int, float, str, bool, type(None)})


def _freeze(value: Any) -> Any:
    """Make an attribute value hashable: lists become tuples, dicts sorted item tuples."""
    if value.__class__ in _PLAIN:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(value))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class OpSpec(tuple):
    """One aten op on the device: name ("aten::mm"), input and output tensors, attributes.

    A tuple underneath (name, inputs, outputs, frozen attrs), so building one and
    hashing it as a cache key cost little on the eager path's hot loop."""

    __slots__ = ()

    def __new__(
        cls,
        name: str,
        inputs: tuple[TensorSpec, ...] = (),
        outputs: tuple[TensorSpec, ...] = (),
        attrs: Mapping[str, Any] | tuple | None = None,
    ) -> Self:
        if attrs:
            items = attrs.items() if attrs.__class__ is dict or isinstance(attrs, Mapping) \
                else attrs
            frozen = tuple(sorted([(k, _freeze(v)) for k, v in items]))
        else:
            frozen = ()
        if inputs.__class__ is not tuple:
            inputs = tuple(inputs)
        if outputs.__class__ is not tuple:
            outputs = tuple(outputs)
        return tuple.__new__(cls, (name, inputs, outputs, frozen))

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    @property
    def name(self) -> str:
        return self[0]

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self[1]

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self[2]

    @property
    def attrs(self) -> dict[str, Any]:
        """The attributes as a dict (values frozen: lists became tuples)."""
        return dict(self[3])

    def __repr__(self) -> str:
        return (
            f"OpSpec(name={self.name!r}, inputs={self.inputs!r}, outputs={self.outputs!r}, "
            f"attrs={self.attrs!r})"
        )

    def attr(self, key: str, default: Any = None) -> Any:
        """Attribute `key`, or `default` when the op did not set it."""
        for k, v in self[3]:
            if k == key:
                return v
        return default

    def replace(self, **changes: Any) -> OpSpec:
        """A copy with some fields changed (used to split `_foreach_*` ops per tensor)."""
        fields = {"name": self[0], "inputs": self[1], "outputs": self[2], "attrs": self[3]}
        fields.update(changes)
        return OpSpec(**fields)
