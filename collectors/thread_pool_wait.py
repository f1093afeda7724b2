"""While recording, OpenMP's worker threads wait asleep between parallel regions.

The host computes each op's numbers with PyTorch's CPU kernels, whose OpenMP workers
(libgomp) spin for a while after every parallel region by default. That time is not the
program's, and on an idle machine the spinning worker has a core to itself; on a loaded
one it competes with the recorded thread and with the machine's other work, and the
program's measured host time grew with the load: a GPT step recorded under two busy
processes per core took 50-54 ms with spinning workers and 25-26 ms with sleeping ones,
against 24-32 ms on the idle machine (docs/benchmarks.md). The emulation's own time is
taken off the host clock either way, so sleeping workers cost the recording only the
wake-up at each parallel region.

libgomp reads `OMP_WAIT_POLICY` once, when it is loaded with torch: `record` sets it
before anything imports torch, for the program and every process it starts. A value the
user set (or `GOMP_SPINCOUNT`) is kept.
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
_USER_CHOICES = (WAIT_POLICY_ENV, "GOMP_SPINCOUNT")


def wait_asleep() -> bool:
    """Ask OpenMP's workers to sleep when idle; False where the user chose, or too late."""
    if any(name in os.environ for name in _USER_CHOICES) or "torch" in sys.modules:
        return False
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return True


def policy() -> str:
    """The wait policy this process's OpenMP runs with (trace metadata)."""
    return os.environ.get(WAIT_POLICY_ENV, "default (spin, then sleep)")
