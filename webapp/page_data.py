"""Asks a trace for one analysis and says plainly when the trace cannot answer it.

Traces from other tools (PyTorch-profiler JSON from a GPU) hold less than ours: a
page whose data is missing shows a notice instead of failing, and a real error is
logged with its traceback and shown as one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pandas as pd
from neuron_explorer.webapp.trace_store import hide_paths

log = logging.getLogger("neuron_explorer.webapp")


@dataclass
class PageData:
    """An analysis result, or why there is none."""

    value: Any = None
    missing: str = ""  # shown to the user when value is None

    @property
    def ok(self) -> bool:
        return not self.missing


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, pd.DataFrame):
        return value.empty
    if isinstance(value, (list, dict, tuple)):
        return len(value) == 0
    return False


def fetch(trace: Any, what: str, label: str, *args: Any, **kwargs: Any) -> PageData:
    """Calls `trace.<what>(...)` (or reads the attribute) and wraps the outcome for a page."""
    attr = getattr(trace, what, None)
    if attr is None:
        return PageData(missing=f"This trace has no {label}.")
    try:
        value = attr(*args, **kwargs) if callable(attr) else attr
    except Exception as exc:  # a page must keep working whatever one analysis does
        log.exception("computing %s failed", what)
        return PageData(missing=hide_paths(f"Could not compute the {label} for this trace: {exc}", {}))
    if _is_empty(value):
        return PageData(missing=f"This trace has no {label}.")
    return PageData(value=value)


def table(trace: Any, name: str) -> pd.DataFrame:
    """One of the trace's tables, or an empty frame when the trace lacks it."""
    value = getattr(trace, name, None)
    return value if isinstance(value, pd.DataFrame) else pd.DataFrame()
