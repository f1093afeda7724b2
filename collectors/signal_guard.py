"""Signals that arrive while the recorder writes a slice's begin or end wait until it is done.

Ctrl-C (SIGINT) and `kill` (SIGTERM, which the record command turns into an exception)
raise in the program wherever it is, also inside the recorder between noting a slice as
open and writing its begin, or between writing an end and forgetting the slice. The
trace would then end with a slice's end without its begin. The handlers of those two
signals are wrapped: inside a `guarded()` section they only note the signal, and the
section's end runs the handler, with the recorder's state and the trace agreeing. A
signal that lands in a garbage-collector callback or a `__del__` (the host clock and the
device allocator run there), where Python would print the handler's exception as ignored
and lose it, or in a device method C++ calls (`CALLED_FROM_NATIVE`), where it would abort
the process, is sent again a moment later.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Guard:
    __slots__ = ("depth", "pending")

    def __init__(self) -> None:
        self.depth = 0  # guarded sections running (they nest)
        self.pending: tuple[Callable, int, FrameType | None] | None = None


_guard = _Guard()


def deferring(handler: Any) -> Any:
    """`handler` wrapped so that it waits for the end of a guarded section; SIG_DFL, SIG_IGN
    and already wrapped handlers are returned as they are."""
    if not callable(handler) or getattr(handler, "_neuron_explorer_deferring", False):
        return handler

    def deferred(signum: int, frame: FrameType | None) -> None:
        if _swallows_exceptions(frame):
            # Raised here, the handler's exception would be printed as "ignored" and the
            # signal lost (the program ran on after a `kill`): send it again in a moment.
            timer = threading.Timer(RESEND_S, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()
            return
        if _guard.depth:
            _guard.pending = (handler, signum, frame)
            return
        handler(signum, frame)

    deferred._neuron_explorer_deferring = True  # type: ignore[attr-defined]
    deferred.__wrapped__ = handler  # type: ignore[attr-defined]
    return deferred


RESEND_S = 0.005


def _swallows_exceptions(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside a garbage-collector callback or a `__del__`, where
    Python prints an exception as ignored instead of raising it, or inside a method of
    the device's that C++ calls where an exception aborts the process ("terminate called
    without an active exception": the device guard's, in the middle of an op)."""
    callbacks = {getattr(getattr(cb, "__func__", cb), "__code__", None) for cb in gc.callbacks}
    callbacks |= _native_callbacks()
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code in callbacks:
            return True
        frame = frame.f_back
    return False


@functools.cache
def _native_callbacks() -> frozenset:
    from neuron_explorer.backend.registration import CALLED_FROM_NATIVE

    return frozenset(f.__code__ for cls in CALLED_FROM_NATIVE for f in vars(cls).values()
                     if inspect.isfunction(f))


def install() -> dict[int, Any]:
    """Wrap the current SIGINT and SIGTERM handlers (main thread only); returns the previous
    ones for `restore`."""
    previous: dict[int, Any] = {}
    for signum in SIGNALS:
        with contextlib.suppress(ValueError, TypeError):  # not the main thread
            current = signal.getsignal(signum)
            wrapped = deferring(current)
            if wrapped is not current:
                signal.signal(signum, wrapped)
                previous[signum] = current
    return previous


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers `install` wrapped, where nothing replaced ours since."""
    for signum, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):
            current = signal.getsignal(signum)
            if getattr(current, "__wrapped__", None) is handler:
                signal.signal(signum, handler)


def enter() -> None:
    """Start a guarded section (pair with `leave`, in a finally)."""
    _guard.depth += 1


def leave() -> None:
    """End a guarded section; the outermost one runs a signal's handler noted meanwhile."""
    _guard.depth -= 1
    if _guard.depth == 0 and _guard.pending is not None:
        handler, signum, frame = _guard.pending
        _guard.pending = None
        if threading.current_thread() is not threading.main_thread():
            # a recording thread ended the section: the handler's exception belongs to the
            # main thread, where Python runs signal handlers
            os.kill(os.getpid(), signum)
            return
        handler(signum, frame)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """A section during which SIGINT and SIGTERM wait (see the module docstring)."""
    enter()
    try:
        yield
    finally:
        leave()
