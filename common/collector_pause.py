"""Python's cyclic garbage collector paused while a large build runs.

A build that makes millions of containers that live until it ends (a trace's parse into
columns, an NKI kernel's instructions, tiles and views) has the collector walk them
again and again as they accumulate: 15-35% of such a build's time. They hold no cycles
that must go before the build ends; refcounting frees them as before, and the collector
runs again when the outermost pause ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0  # pauses running now, in any thread
_depth_lock = threading.Lock()
_collector_was_on = False  # whether the outermost pause found the collector on


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection in the block; nested and from several threads, the collector
    comes back, as the outermost pause found it, when that pause ends (also on a raise)."""
    global _depth, _collector_was_on
    with _depth_lock:
        if _depth == 0:
            _collector_was_on = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _depth_lock:
            _depth -= 1
            if _depth == 0 and _collector_was_on:
                gc.enable()
