"""Whether numba is installed: the large walks (the .pftrace wire scan, the critical path,
the kernel schedule) then run compiled; without it, their Python versions do the same."""

from __future__ import annotations

import importlib.util
from functools import cache


@cache
def numba_available() -> bool:
    """Whether numba can be imported (found without importing it: that takes a while)."""
    return importlib.util.find_spec("numba") is not None
