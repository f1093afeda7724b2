"""A kernel whose instructions carry the kernel source line that issued them.

The trace writer reads `instruction_sources` ((names, index per instruction)) and
writes each instruction's line as its `source` arg, in the "file:line" form op slices
use (the path relative to the working directory).
"""

from __future__ import annotations

import os

import numpy as np
from neuron_explorer.backend.hardware.kernel import Kernel


class SourcedKernel(Kernel):
    __slots__ = ("instruction_sources",)
    instruction_sources: tuple[list[str], np.ndarray]


def with_sources(kernel: Kernel, lines: list[tuple[str, int]]) -> SourcedKernel:
    out = SourcedKernel.__new__(SourcedKernel)
    for slot in Kernel.__slots__:
        setattr(out, slot, getattr(kernel, slot))
    cwd = os.getcwd() + os.sep
    keys = sorted(set(lines))
    names = [f"{f.removeprefix(cwd)}:{n}" for f, n in keys]
    position = {k: i for i, k in enumerate(keys)}
    index = np.fromiter((position[k] for k in lines), np.int64, len(lines))
    out.instruction_sources = (names, index)
    return out
