"""Element sizes of tensor dtypes by name: what the device's lowering and the explorer's
rules both read (a trace names its dtypes as torch prints them)."""

from __future__ import annotations

from typing import Any

# bytes per element; names as torch prints them without the "torch." prefix
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}
_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "long": "int64",
            "int": "int32",
            # as PyTorch-profiler traces name them (C++ types, lowercased)
            "c10::half": "float16", "c10::bfloat16": "bfloat16", "long int": "int64",
            "short": "int16", "signed char": "int8", "unsigned char": "uint8"}


def normalize_dtype(dtype: Any) -> str:
    """'torch.float32', torch.float32 or 'float' -> 'float32'."""
    name = str(dtype)
    name = name.removeprefix("torch.")
    return _ALIASES.get(name, name)


def dtype_bytes(dtype: str, default: int = 4) -> int:
    """Element size of `dtype` in bytes (`default` for names this table does not know)."""
    size = DTYPE_BYTES.get(dtype)
    if size is None:
        size = DTYPE_BYTES.get(normalize_dtype(dtype), default)
    return size
