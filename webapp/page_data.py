"""Asks a trace for one analysis and says plainly when the trace cannot answer it.

Traces from other tools (PyTorch-profiler JSON from a GPU) hold less than ours: a
page whose data is missing shows a notice instead of failing, and a real error is
logged with its traceback and shown as one line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pandas as pd
from neuron_explorer.webapp.trace_store import hide_paths

log = logging.getLogger("neuron_explorer.webapp")
T = TypeVar("T")


@dataclass
class PageData(Generic[T]):
    """An analysis result, or why there is none."""

    value: T | None = None
    missing: str | None = None  # shown to the user when value is None
    empty: bool = False  # the analysis ran and found nothing (not a failure)

    @property
    def ok(self) -> bool:
        return self.missing is None


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, pd.DataFrame):
        return value.empty
    if isinstance(value, (list, dict, tuple)):
        return len(value) == 0
    return False


def fetch(compute: Callable[[], T], label: str) -> PageData[T]:
    """Runs one analysis (`lambda: trace.summary()`) and wraps the outcome for a page."""
    try:
        value = compute()
    except Exception as exc:  # a page must keep working whatever one analysis does
        log.exception("computing the %s failed", label)
        return PageData(missing=hide_paths(
            f"Could not compute the {label} for this trace: {exc}", {}))
    if _is_empty(value):
        return PageData(missing=f"This trace has no {label}.", empty=True)
    return PageData(value=value)
