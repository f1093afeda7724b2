"""How the explorer's column builds use memory: small pages while they run, and the
memory they freed given back to the system when the outermost one ends.

numpy asks Linux for transparent huge pages (madvise) on every large array. Where
the kernel compacts memory on such faults (THP `defrag=madvise`, a common
default), each fresh array of a load pays for compaction, and a load makes many
short-lived arrays: its system time doubles. Inside `building()` numpy asks for
ordinary pages; the previous setting comes back on exit.

glibc keeps what a build frees (its arrays below the mmap threshold, which rises to
32 MiB as large arrays are freed) in the process's heap for reuse: a notebook holding a
loaded 1 M-slice trace kept about 480 MiB resident where its tables take 240. When the
outermost build ends, `malloc_trim` hands the free pages back (a few ms). Arrow's pool
(mimalloc) keeps what the Parquet reads of a cached load decoded the same way: a cached
load of every table held 400 MiB for 225 of tables; it is released at the same time.

Python's cyclic garbage collector is paused while builds run (common/collector_pause.py).
A JSON trace's parse makes millions of dicts and lists that live until their chunk is
collected into columns, and the collector walked them all again and again: 1.4-1.9 s of
a 5 s load of a real 138 K-slice trace.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import numpy as np
from neuron_explorer.common.collector_pause import collector_paused

_depth = 0  # builds running now, in any thread
_depth_lock = threading.Lock()


def _switch() -> Callable[[bool], bool] | None:
    """numpy's (private) huge-page switch, where this numpy has one."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, where the C library is glibc. Looked up among the symbols the
    process has loaded (`CDLL(None)`): `ctypes.util.find_library` runs `ldconfig` in a
    child process, which cost a small trace's load a fifth of its time."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # another C library (musl has no malloc_trim)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def give_back_freed_memory() -> None:
    """Return the free pages of the C heap (glibc's) and of Arrow's memory pool (where
    the Parquet reads decode, and the pandas 3 string columns live) to the system."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    pyarrow = sys.modules.get("pyarrow")  # nothing to give back where it is not in use
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()


@contextmanager
def building() -> Iterator[None]:
    """Small pages for the block (where numpy can be told) and no cyclic collection;
    when the outermost build ends, the memory freed meanwhile goes back to the system."""
    global _depth
    with _depth_lock:
        _depth += 1
    switch = _switch()
    previous = switch(False) if switch is not None else None
    try:
        with collector_paused():
            yield
    finally:
        if switch is not None and previous is not None:
            switch(previous)
        with _depth_lock:
            _depth -= 1
            outermost = _depth == 0
        if outermost:
            give_back_freed_memory()
