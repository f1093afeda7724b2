"""NKI data types: names, sizes, and how the host holds their values.

numpy has no bfloat16 or fp8, so such values are held as float32 rounded to the
dtype (torch does the rounding); every other dtype is held in its own numpy dtype.
"""

from __future__ import annotations

import typing

import numpy as np
import torch
from numpy.typing import DTypeLike

bfloat16 = "bfloat16"
float16 = "float16"
float32 = "float32"
float8_e4m3 = "float8_e4m3"
float8_e5m2 = "float8_e5m2"
int8 = "int8"
int16 = "int16"
int32 = "int32"
uint8 = "uint8"
uint16 = "uint16"
uint32 = "uint32"
bool_ = "bool"

ITEMSIZE = {bfloat16: 2, float16: 2, float32: 4, float8_e4m3: 1, float8_e5m2: 1, int8: 1,
            int16: 2, int32: 4, uint8: 1, uint16: 2, uint32: 4, bool_: 1}
FLOATS = (bfloat16, float16, float32, float8_e4m3, float8_e5m2)
_TORCH_ROUNDED = {bfloat16: torch.bfloat16, float8_e4m3: torch.float8_e4m3fn,
                  float8_e5m2: torch.float8_e5m2}
_ALIASES = {"bf16": bfloat16, "fp16": float16, "half": float16, "fp32": float32,
            "float": float32, "float8_e4m3fn": float8_e4m3, "fp8": float8_e4m3,
            "bool_": bool_}


def normalize(dtype: object) -> str:
    """The NKI dtype name of `dtype` (a name, a numpy or a torch dtype)."""
    if isinstance(dtype, torch.dtype):
        given = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str):
        given = dtype
    else:  # whatever numpy takes for a dtype; np.dtype raises TypeError on anything else
        given = np.dtype(typing.cast(DTypeLike, dtype)).name
    name = _ALIASES.get(given, given)
    if name not in ITEMSIZE:
        raise TypeError(f"unknown dtype {given!r}: use one of {', '.join(ITEMSIZE)}")
    return name


def host_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds values of `dtype` on the host."""
    return np.dtype(np.float32) if dtype in _TORCH_ROUNDED else np.dtype(dtype)


def cast(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` converted to `dtype` (round to nearest even), as the host holds them."""
    rounded = _TORCH_ROUNDED.get(dtype)
    if rounded is not None:
        t = torch.from_numpy(np.array(values, dtype=np.float32))
        return t.to(rounded).to(torch.float32).numpy()
    return np.asarray(values).astype(host_dtype(dtype), copy=False)
