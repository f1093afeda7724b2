"""How numbers read on the page: durations, bytes, rates and shares with sensible units."""

from __future__ import annotations

import math

from neuron_explorer import units


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def duration(ns) -> str:
    """1234567 -> '1.23 ms'."""
    return units.duration(ns, micro="µs", missing="–")


def size(n) -> str:
    """Bytes with binary units: 1536 -> '1.5 KiB'."""
    return "–" if _is_missing(n) else units.size(n)


def share(x) -> str:
    """0.1234 -> '12.3%'."""
    if _is_missing(x):
        return "–"
    x = float(x)
    if 0 < abs(x) < 0.0005:  # a small model's MFU: "0.0023%", not "0.0%" as if nothing ran
        return f"{100 * x:.2g}%"
    return f"{100 * x:.1f}%"


def count(n) -> str:
    """Large counts with SI prefixes: 1.2e12 -> '1.2 T'."""
    if _is_missing(n):
        return "–"
    n = float(n)
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g}"
