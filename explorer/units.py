"""How a duration and a size read, everywhere: report, findings, diff and dashboard."""

from __future__ import annotations

import math
from typing import Any


def duration(ns: Any, *, digits: int = 3, micro: str = "us", missing: str = "-") -> str:
    """A duration in ns with the largest unit it fills: '2.1 s', '1.23 ms', '35 us', '420 ns'.

    `digits` significant digits (the report's tables use 4); `micro` is the micro-second
    unit ("µs" on the dashboard); `missing` stands for None or NaN.
    """
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return missing
    ns = float(ns)
    for unit, size in (("s", 1e9), ("ms", 1e6), (micro, 1e3)):
        if abs(ns) >= size:
            return f"{ns / size:.{digits}g} {unit}"
    return f"{ns:.0f} ns"


def size(n: Any, *, missing: str = "-") -> str:
    """Bytes with binary units: 1536 -> '1.5 KiB'."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return missing
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
