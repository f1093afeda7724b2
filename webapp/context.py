"""What every page gets besides its trace: the served traces and how to compare two of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_explorer.webapp.trace_store import TraceStore


def default_differ(a: Any, b: Any) -> Any:
    import neuron_explorer

    return neuron_explorer.diff(a, b)


@dataclass
class AppContext:
    """What page callbacks need: the traces and how to compare two of them."""

    store: TraceStore
    differ: Callable[[Any, Any], Any] = default_differ
    default_trace: str | None = None
