"""Values a callback reads from the browser, checked: a crafted request gets a 400 with the
reason (see app.py's error handler), never a server error from deep inside a page."""

from __future__ import annotations

import math
from typing import Any

from neuron_explorer.common.errors import NeuronExplorerError

INT64_MAX = 2**63 - 1


class BadInputError(NeuronExplorerError):
    """A callback value no page sends: wrong type, not finite, out of range."""


def finite(value: Any, what: str) -> float:
    """A finite number, or BadInputError naming the value."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadInputError(f"{what} must be a number, not {str(value)[:40]!r}") from None
    if not math.isfinite(number):
        raise BadInputError(f"{what} must be a finite number, not {number}")
    return number


def int_or_default(value: Any, default: Any) -> Any:
    """An int64 read leniently from a URL parameter (`3`, `3.0`), else the default."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    if not math.isfinite(number) or abs(number) > INT64_MAX:
        return default
    return int(number)


def text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadInputError(f"{what} must be a non-empty string")
    return value
