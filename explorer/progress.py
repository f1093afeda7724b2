"""Progress bars on stderr for work that takes more than a second.

A bar shows only when stderr is a terminal or the code runs in a Jupyter kernel (there
tqdm.auto draws a notebook bar), unless asked otherwise, after the first second, and never
under `--quiet` (`enabled=False`), so scripts, pipes and tests see nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (what, done, total) for each bar opened on this thread: the dashboard's loading page
Listener = Callable[[str, int, int], None]
_listeners = threading.local()


@contextmanager
def steps(total: int, what: str, enabled: bool | None = None, unit: str = "step"
          ) -> Iterator[Any]:
    """A bar of `total` steps (call `.update()` after each); `enabled`: None shows it when
    stderr is a terminal or in a notebook, False never, True always."""
    disable = (not enabled) if enabled is not None else not (_is_terminal() or _in_notebook())
    bar: Any = _Hidden() if disable else _drawn(total, what, unit)
    listener: Listener | None = getattr(_listeners, "current", None)
    try:
        if listener is None:
            yield bar
        else:
            listener(what, 0, total)
            yield _Reported(bar, listener, what, total)
    finally:
        bar.close()


@contextmanager
def observe(listener: Listener) -> Iterator[None]:
    """Tell `listener` (what, done, total) as every bar opened on this thread moves, whether
    or not it is drawn: how the dashboard shows a load's progress."""
    previous = getattr(_listeners, "current", None)
    _listeners.current = listener
    try:
        yield
    finally:
        _listeners.current = previous


def _drawn(total: int, what: str, unit: str) -> Any:
    from tqdm.auto import tqdm  # 30 ms to import: only for a bar that may be drawn

    return tqdm(total=total, desc=what, unit=unit, file=sys.stderr, delay=1.0, leave=False)


class _Hidden:
    """A bar that is never drawn: counts its steps, as a disabled tqdm bar does."""

    disable = True

    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass


class _Reported:
    """A tqdm bar that also reports each update to a listener."""

    def __init__(self, bar: Any, listener: Listener, what: str, total: int) -> None:
        self._bar, self._listener, self._what, self._total = bar, listener, what, total
        self._done = 0

    def update(self, n: int = 1) -> Any:
        self._done += n
        self._listener(self._what, self._done, self._total)
        return self._bar.update(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)


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
