"""The host clock: real time minus the time spent emulating the device and recording.

The trace shows the program as it would run on the real chip, so the host clock
skips the time the host spends computing the device's numbers (and the time
collectors spend recording), and jumps forward when the host waits for the device
at a sync point. The device clock shares this timeline: kernels are placed on it by
the simulator, in ns.
"""

from __future__ import annotations

import time

_perf_ns = time.perf_counter_ns


class HostClock:
    """Monotonic ns clock with excluded intervals and forward jumps."""

    __slots__ = ("_offset", "_origin")

    def __init__(self) -> None:
        self._origin = _perf_ns()
        self._offset = 0  # added to real elapsed time: -excluded + waited

    def now(self) -> int:
        """Current host time in ns since the clock started."""
        return _perf_ns() - self._origin + self._offset

    def exclude(self, ns: int) -> None:
        """Remove `ns` of real time (emulation or recording work) from the timeline."""
        self._offset -= ns

    def advance_to(self, t_ns: int) -> int:
        """Move the clock forward to `t_ns` if it is behind; return the time jumped."""
        jump = t_ns - self.now()
        if jump > 0:
            self._offset += jump
            return jump
        return 0

    def real_ns(self) -> int:
        """Raw monotonic time, for measuring work that is to be excluded."""
        return _perf_ns()

    def origin_unix_ns(self) -> int:
        """Wall-clock time (Unix ns) at which this clock read zero, for trace metadata."""
        return time.time_ns() - (_perf_ns() - self._origin)


clock = HostClock()
