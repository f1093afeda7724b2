"""Progress bars on stderr for work that takes more than a second.

A bar shows only when stderr is a terminal or the code runs in a Jupyter kernel (there
tqdm.auto draws a notebook bar), unless asked otherwise, after the first second, and never
under `--quiet` (`enabled=False`), so scripts, pipes and tests see nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def steps(total: int, what: str, enabled: bool | None = None, unit: str = "step"
          ) -> Iterator[Any]:
    """A bar of `total` steps (call `.update()` after each); `enabled`: None shows it when
    stderr is a terminal or in a notebook, False never, True always."""
    from tqdm.auto import tqdm

    disable = (not enabled) if enabled is not None else not (_is_terminal() or _in_notebook())
    bar = tqdm(total=total, desc=what, unit=unit, file=sys.stderr, delay=1.0,
               disable=disable, leave=False)
    try:
        yield bar
    finally:
        bar.close()


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    return getattr(shell, "kernel", None) is not None
