"""The op key an op slice carries, as text: what the device lowering needs to run the op
again (the what-if replay), besides the input shapes and dtypes the slice already has.

An op key is the runtime's `(op name, inputs, outputs, attrs)` (backend/runtime.py):
inputs and outputs are `(shape, dtype)` pairs, attrs the non-tensor arguments that can
change the op's cost. The lowering reads nothing else (no strides, offsets or values),
so these four fields re-lower an op exactly. The slice's `shapes` and `dtypes` args
already hold the inputs; the `key` arg adds the rest as compact JSON,
`[[[out shape], "out dtype"], ...]` then, when there are any, `[["attr", value], ...]`.
This module imports nothing heavy: the collectors use it while recording.
"""

from __future__ import annotations

import json
from typing import Any

# (shape, dtype name) pairs, attrs as (name, value) pairs: the replay's op key
TensorSig = tuple[tuple[int, ...], str]
DecodedKey = tuple[str, tuple[TensorSig, ...], tuple[TensorSig, ...], tuple[tuple[str, Any], ...]]

_COMPACT = (",", ":")


def dtype_name(dtype: object) -> str:
    """"float32" for torch.float32 (names pass through)."""
    return str(dtype).removeprefix("torch.")


def encode(outputs: tuple, attrs: tuple) -> str:
    """The `key` arg of an op slice: its outputs and attrs (see the module doc)."""
    outs = [[list(shape), dtype_name(dtype)] for shape, dtype in outputs]
    if not attrs:
        return json.dumps([outs], separators=_COMPACT)
    return json.dumps([outs, [[name, value] for name, value in attrs]], separators=_COMPACT,
                      default=str)


def _as_tuples(value: Any) -> Any:
    """JSON lists back to the tuples the recorded attrs held."""
    if isinstance(value, list):
        return tuple(_as_tuples(v) for v in value)
    return value


def parse_shapes(text: str) -> list[list[int]]:
    """The `shapes` arg ("[[64, 512], []]") as lists."""
    return json.loads(text) if text else []


def parse_dtypes(text: str) -> list[str]:
    """The `dtypes` arg ("[float32, int64]") as names."""
    inner = text.strip().removeprefix("[").removesuffix("]").strip()
    return [d.strip() for d in inner.split(",")] if inner else []


class OpKeyError(ValueError):
    """An op slice's key args do not decode (a damaged or hand-made trace)."""


def decode(name: str, shapes: str, dtypes: str, key: str) -> DecodedKey:
    """An op slice's name and `shapes`, `dtypes` and `key` args as an op key; OpKeyError
    when they are not what the recorder writes."""
    try:
        parts = json.loads(key)
        ins = tuple((tuple(s), d) for s, d in zip(parse_shapes(shapes), parse_dtypes(dtypes),
                                                   strict=True))
        outs = tuple((tuple(s), str(d)) for s, d in parts[0])
        attrs = tuple((str(n), _as_tuples(v)) for n, v in parts[1]) if len(parts) > 1 else ()
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise OpKeyError(f"{name}: its op key does not decode ({exc})") from None
    return name, ins, outs, attrs
