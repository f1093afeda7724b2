"""Analysis results kept on the trace (or run) they were computed from."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import is_dataclass
from typing import Any, TypeVar

import pandas as pd
from neuron_explorer.loaders.build_memory import building

T = TypeVar("T")


def memoised(owner: Any, key: str, compute: Callable[[], T]) -> T:
    """`compute()`, once per owner and key; each call returns a copy of the first result
    that the caller may change without changing the kept one (`t.op_stats().drop(...,
    inplace=True)` once emptied every later `t.op_stats()`)."""
    memo = owner.__dict__.setdefault("_memo", {})
    if key not in memo:
        with building():  # analyses, like loads, make many short-lived arrays
            memo[key] = compute()
    return _copy(memo[key])


def kept(owner: Any, key: str) -> Any:
    """What `memoised` kept for `key` (a copy), or None where nothing was computed yet."""
    memo = owner.__dict__.get("_memo", {})
    return _copy(memo[key]) if key in memo else None


def _copy(value: Any) -> Any:
    """A copy that shares no mutable container with `value`: frames copied shallowly
    (pandas copies on write, so a change to either leaves the other as it was), lists,
    sets, tuples and dicts rebuilt with their items copied the same way."""
    if isinstance(value, (pd.DataFrame, pd.Series)):
        return value.copy(deep=False)
    if isinstance(value, dict):
        return type(value)((k, _copy(v)) for k, v in value.items())
    if isinstance(value, (list, set)):
        return type(value)(_copy(v) for v in value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copy(v) for v in value)
    if is_dataclass(value) and not isinstance(value, type) and \
            not value.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return copy.deepcopy(value)  # a Finding: small, and its evidence lists its own
    return value
