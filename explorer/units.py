"""How a duration reads, everywhere: report, findings, diff and dashboard."""

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
