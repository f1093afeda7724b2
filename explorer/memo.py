"""Analysis results kept on the trace (or run) they were computed from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from neuron_explorer.loaders.huge_pages import small_pages

T = TypeVar("T")


def memoised(owner: Any, key: str, compute: Callable[[], T]) -> T:
    """`compute()`, once per owner and key; later calls return the first result."""
    memo = owner.__dict__.setdefault("_memo", {})
    if key not in memo:
        with small_pages():  # analyses, like loads, make many short-lived arrays
            memo[key] = compute()
    return memo[key]
