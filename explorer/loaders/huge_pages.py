"""Small memory pages while the explorer builds its columns (numpy's huge-page advice off).

numpy asks Linux for transparent huge pages (madvise) on every large array. Where
the kernel compacts memory on such faults (THP `defrag=madvise`, a common
default), each fresh array of a load pays for compaction, and a load makes many
short-lived arrays: its system time doubles. Inside `small_pages()` numpy asks
for ordinary pages; the previous setting comes back on exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np


def _switch() -> Callable[[bool], bool] | None:
    """numpy's (private) huge-page switch, where this numpy has one."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


@contextmanager
def small_pages() -> Iterator[None]:
    """Turn numpy's huge-page advice off for the block (a no-op where it cannot be set)."""
    switch = _switch()
    if switch is None:
        yield
        return
    previous = switch(False)
    try:
        yield
    finally:
        switch(previous)
