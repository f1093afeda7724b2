"""Slice arguments (Chrome `args`, Perfetto debug annotations), read by column or by slice.

Derived tables need a few keys of many slices (op_id, flops, ...); users sometimes
want one slice's whole dict. `DictArgs` holds the dicts a JSON trace already has;
`ColumnArgs` holds a long table (slice, key, value) decoded from a .pftrace and
builds dicts only when asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


class SliceArgs:
    """Access to the args of slices by slice id."""

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        """Values of `key` for the given slice ids (None where absent), as an object array."""
        raise NotImplementedError

    def dicts(self) -> list[dict[str, Any] | None]:
        """One dict (or None) per slice, indexed by slice id."""
        raise NotImplementedError

    def get(self, slice_id: int) -> dict[str, Any] | None:
        """The args of one slice."""
        raise NotImplementedError


class DictArgs(SliceArgs):
    """Args as a list of dicts, one per slice id."""

    def __init__(self, items: list[dict[str, Any] | None]) -> None:
        self._items = items

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        items = self._items
        out = np.empty(len(ids), object)
        out[:] = [(a.get(key) if a else None) for a in (items[i] for i in ids.tolist())]
        return out

    def dicts(self) -> list[dict[str, Any] | None]:
        return self._items

    def get(self, slice_id: int) -> dict[str, Any] | None:
        return self._items[slice_id]


class ColumnArgs(SliceArgs):
    """Args as a long table: columns slice_id, key, value (object), sorted by slice_id."""

    def __init__(self, long: pd.DataFrame, n_slices: int) -> None:
        self.long = long
        self._n = n_slices
        self._by_key: dict[str, pd.Series] | None = None
        self._dicts: list[dict[str, Any] | None] | None = None

    def _key_index(self) -> dict[str, pd.Series]:
        if self._by_key is None:
            self._by_key = {
                str(k): pd.Series(g["value"].to_numpy(), index=g["slice_id"].to_numpy())
                for k, g in self.long.groupby("key", sort=False)
            }
        return self._by_key

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        series = self._key_index().get(key)
        out = np.empty(len(ids), object)
        if series is None:
            return out
        series = series[~series.index.duplicated(keep="last")]
        out[:] = series.reindex(ids).to_numpy(dtype=object)
        out[pd.isna(out)] = None
        return out

    def dicts(self) -> list[dict[str, Any] | None]:
        if self._dicts is None:
            items: list[dict[str, Any] | None] = [None] * self._n
            ids = self.long["slice_id"].to_numpy()
            keys = self.long["key"].to_numpy()
            values = self.long["value"].to_numpy()
            bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                items[ids[a]] = dict(zip(keys[a:b].tolist(), values[a:b].tolist(), strict=True))
            self._dicts = items
        return self._dicts

    def get(self, slice_id: int) -> dict[str, Any] | None:
        if self._dicts is not None:
            return self._dicts[slice_id]
        rows = self.long[self.long["slice_id"].to_numpy() == slice_id]
        return dict(zip(rows["key"], rows["value"], strict=True)) or None
