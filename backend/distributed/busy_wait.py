"""Waiting for the other ranks with the CPU kept busy, as a real host's wait would.

Every collective here moves its bytes through gloo before it returns, so a rank that
arrives first blocks until the last one arrives: a wait no real stack has (a real host
queues the collective and runs on, and its syncs on the device spin: CUDA's default
while a machine has more cores than GPUs). Blocked, the rank's CPU goes idle; on a
virtual machine an idle CPU comes back slow, its caches cold: after a 15 ms sleep the
next millisecond of PyTorch ran 1.7-2.1x slower here, in plain PyTorch as in a
recording. The recorder leaves the blocked time itself off the host clock, but not that
slowdown: a rank that waited for a straggler measured its own Python 40-90% slower, and
the straggler's saving came out short by the difference.

So a wait longer than a millisecond spins, yielding the CPU to any other runnable thread
at each turn, until the work completes; past `SPIN_NS` it blocks (a rank that waits that
long for another's compile or data loading does not burn a core for it). As CUDA does, it
spins only while the machine has a CPU for each of its ranks (`spins`): with more ranks
than CPUs no CPU goes idle, and a spinning rank would take turns from the ranks doing
work."""

from __future__ import annotations

import os
import time
from typing import Any

# a straggler's extra work per step is milliseconds to tens of milliseconds
SPIN_NS = 200_000_000
# Waits shorter than this nap instead (off the CPU, polled every NAP_S): an idle this short
# leaves the CPU as fast as before (a 1 ms sleep a step changed nothing), and a spinning
# rank takes turns from the rank it waits for wherever the machine is busy (a balanced
# run beside a busy process waited up to 25% of its steps spinning, 14% napping)
NAP_NS = 1_000_000
NAP_S = 0.0001


def spins(local_ranks: int) -> bool:
    """Whether ranks wait spinning: while the CPUs this process may run on are at least
    the ranks on this machine."""
    return local_ranks <= len(os.sched_getaffinity(0))


def wait(work: Any) -> None:
    """Wait for a c10d `Work` like `work.wait()`: napping for `NAP_NS`, then spinning
    until `SPIN_NS`, then blocked."""
    start = time.monotonic_ns()
    while not work.is_completed() and time.monotonic_ns() - start < NAP_NS:
        time.sleep(NAP_S)
    while not work.is_completed() and time.monotonic_ns() - start < SPIN_NS:
        os.sched_yield()
    work.wait()  # returns at once when done; raises the collective's error


class BusyWaits:
    """A gloo process group whose works wait with `wait` when `spin` (the rest, and
    every wait otherwise, is gloo's own)."""

    def __init__(self, group: Any, spin: bool = True) -> None:
        self._group = group
        self._spin = spin

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._group, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            spun = self._spin and hasattr(result, "is_completed")
            return _BusyWork(result) if spun else result

        return call


class _BusyWork:
    """A gloo work whose `wait` spins first (the rest is the work's own)."""

    def __init__(self, work: Any) -> None:
        self._work = work

    def wait(self) -> bool:
        wait(self._work)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)
