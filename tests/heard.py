"""The warnings a piece of code gives, for tests that compare them between two ways of
doing the same thing."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def warnings_heard() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning given inside, each time (not once per place). ResourceWarnings are
    left out: they are the garbage collector's, of a file or pipe another test left open,
    heard wherever a collection happens to run (a streamed load heard one)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)
        yield caught
