"""Interval arithmetic on numpy arrays: unions, and how much of a window a union covers.

Breakdowns partition time by priority with unions alone: the part of B not under A
is |A ∪ B| - |A|, so no interval subtraction is needed.
"""

from __future__ import annotations

import numpy as np


class Union:
    """Disjoint, sorted intervals [start, end) with prefix sums of their lengths."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        starts = np.asarray(starts, np.int64)
        ends = np.asarray(ends, np.int64)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if len(starts):
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
            reach = np.maximum.accumulate(ends)
            new = np.r_[True, starts[1:] > reach[:-1]]
            self.starts = starts[new]
            self.ends = np.maximum.reduceat(reach, np.flatnonzero(new))
        else:
            self.starts = np.zeros(0, np.int64)
            self.ends = np.zeros(0, np.int64)
        self.prefix = np.r_[0, np.cumsum(self.ends - self.starts)]

    @classmethod
    def of(cls, *parts: tuple[np.ndarray, np.ndarray]) -> Union:
        """Union of several (starts, ends) pairs."""
        if not parts:
            return cls(np.zeros(0), np.zeros(0))
        return cls(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    @property
    def total(self) -> int:
        return int(self.prefix[-1])

    def covered(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Length of the union inside each window [a, b), vectorised over windows."""
        a = np.asarray(a, np.int64)
        b = np.asarray(b, np.int64)
        if not len(self.starts):
            return np.zeros(len(a), np.int64)
        return self._upto(b) - self._upto(a)

    def _upto(self, t: np.ndarray) -> np.ndarray:
        """Covered length in (-inf, t)."""
        i = np.searchsorted(self.starts, t, side="right")  # intervals starting before t
        full = self.prefix[np.maximum(i - 1, 0)]
        last_start = self.starts[np.maximum(i - 1, 0)]
        last_end = self.ends[np.maximum(i - 1, 0)]
        partial = np.clip(np.minimum(t, last_end) - last_start, 0, None)
        return np.where(i > 0, full + partial, 0)

    def minus(self, other: Union) -> Union:
        """The parts of this union that `other` does not cover."""
        if not len(self.starts) or not len(other.starts):
            return self
        lo = min(int(self.starts[0]), int(other.starts[0]))
        hi = max(int(self.ends[-1]), int(other.ends[-1]))
        # other's complement within [lo, hi), then each of its holes clipped to ours
        a, b = np.r_[lo, other.ends], np.r_[other.starts, hi]
        first = np.searchsorted(self.ends, a, side="right")  # ours ending after a hole opens
        last = np.searchsorted(self.starts, b, side="left")  # ours starting before it shuts
        n = np.clip(last - first, 0, None)
        hole = np.repeat(np.arange(len(a)), n)
        ours = np.repeat(first, n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        return Union(np.maximum(self.starts[ours], a[hole]), np.minimum(self.ends[ours], b[hole]))

    def gaps(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Holes of the union between its first start and last end, clipped to [lo, hi)."""
        if len(self.starts) < 2:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        g0, g1 = self.ends[:-1], self.starts[1:]
        g0, g1 = np.maximum(g0, lo), np.minimum(g1, hi)
        keep = g1 > g0
        return g0[keep], g1[keep]
