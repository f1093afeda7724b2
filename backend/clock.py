"""The host clock: the time the program itself would take on an unloaded host.

The trace shows the program as it would run on the real chip and a real host, so
the host clock counts only the program's own work between device calls and its
real waits. It leaves out:

- the time the host spends emulating the device and recording (callers measure
  such an interval with `real_ns()` and pass it to `exclude`);
- time the process was runnable but not running: preemption by other processes and
  the wait for a CPU after waking up (the kernel's per-thread run delay,
  /proc/thread-self/schedstat);
- garbage-collector pauses (`gc.callbacks`), kept as marks for the trace instead.

Sleeping, I/O and waiting on locks, queues, worker processes or other ranks keep
counting: the thread is off the run queue then, not preempted. Three sources:

- ``load-free`` (the default while recording): monotonic time minus run delay and GC
  pauses;
- ``wall`` (``NEURON_HOST_CLOCK=wall``, and whenever nothing records: the cheapest):
  monotonic time;
- ``modelled`` (``NEURON_HOST_CLOCK=modelled``): no measurement at all; the clock
  moves only by modelled costs, so recordings are reproducible byte for byte.

docs/recording.md explains the design and its limits.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

_perf_ns = time.perf_counter_ns

WALL, LOAD_FREE, MODELLED = "wall", "load-free", "modelled"
SOURCES = (WALL, LOAD_FREE, MODELLED)
ENV_VAR = "NEURON_HOST_CLOCK"

# A thread's run delay is read again only after this much time without a clock read
# on that thread: a preemption makes such a gap (a scheduler slice is milliseconds),
# and a read costs about 2 µs, so tight loops of ops read it almost never.
RUN_DELAY_REFRESH_NS = 200_000
# GC pauses at least this long are marked in the trace (all of them are left out).
GC_MARK_NS = 100_000
_MARKS_LIMIT = 100_000

_SCHEDSTAT = "/proc/thread-self/schedstat"


def requested_source() -> str:
    """The source `NEURON_HOST_CLOCK` asks a recording to use (default: load-free)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "measured", LOAD_FREE, "loadfree"):
        return LOAD_FREE
    if value == WALL:
        return WALL
    if value in (MODELLED, "modeled"):
        return MODELLED
    raise ValueError(f"{ENV_VAR}={value!r} is not a host clock: use load-free (the default), "
                     "wall or modelled")


def _run_delay(fd: int) -> int:
    """The second field of a schedstat file: the thread's run delay so far, in ns. Parsed
    without building a list: an allocation the garbage collector tracks could start a
    collection, and so a GC pause, inside a clock reading."""
    data = os.pread(fd, 96, 0)
    first = data.index(b" ") + 1
    return int(data[first:data.index(b" ", first)])


class ThreadRunDelay:
    """The calling thread's run delay so far, in ns (0 where the system does not keep
    it): for a process outside the clock (a DataLoader worker) to time its own work
    load-free, as the clock times the program's. Made on the thread it reads."""

    def __init__(self) -> None:
        try:
            self.fd = os.open(_SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self.fd = -1

    def read(self) -> int:
        if self.fd < 0:
            return 0
        try:
            return _run_delay(self.fd)
        except (OSError, ValueError):
            return 0


class _ThreadDelay(threading.local):
    """Per thread: its schedstat file, the run delay read last, the last clock read."""

    fd = -1
    run_delay = 0
    last_read = 0
    generation = -1  # the clock's load-free session this thread's baseline belongs to


class HostClock:
    """Monotonic ns clock with excluded intervals, forward jumps and deferred deductions."""

    def __init__(self) -> None:
        self.source = WALL
        self._base = 0  # keeps raw readings continuous when the source changes
        self._read = self._wall_ns  # the source's raw reading, in ns
        self._offset = -_perf_ns()  # now() = _read() + _offset
        self._uncounted = 0  # load-free: run delay seen so far
        self._excluded = 0  # time taken off by exclude() (and GC pauses) so far
        self._threads = _ThreadDelay()
        self._pending = 0  # time to take off the next program interval (<0: to add)
        self._floor = 0  # ... but never below this host time
        self._virtual = 0  # modelled: the raw reading, constant
        self._gc_start: tuple[int, int, int] | None = None  # raw, measured, host
        self._last_load_free = 0  # load-free: the latest raw reading (readings never fall)
        self._generation = 0  # load-free sessions so far: run delay counts within one
        self.marks: list[tuple[str, int, int, dict]] = []  # uncounted pauses for the trace
        self.mark_pauses = False
        self.schedstat_ok = os.path.exists(_SCHEDSTAT)

    # -- readings ---------------------------------------------------------------------

    def now(self) -> int:
        """Current host time in ns since the clock started."""
        t = self._read() + self._offset
        if self._pending:
            t = self._settle(t)
        return t

    def real_ns(self) -> int:
        """The measured clock: the source's reading minus all time excluded so far. Work
        to exclude is measured as a difference of these readings, so an exclusion nested
        in another (a tensor freed by the collector inside a hook) is taken off once."""
        return self._read() - self._excluded

    def stamp(self) -> tuple[int, int]:
        """(`real_ns()`, `now()`) from one reading of the source: a timestamp at the start
        of work to exclude. Read apart, the time between the readings would count in the
        timestamp and then be excluded with the work, stepping the clock back below it.
        Both come from the reading before anything that allocates (the settle, the tuple):
        a garbage collection started there takes its pause off the offset and the
        exclusions alike, and one of the pair read after it would count the pause twice
        (the exclusion this stamp starts would take it off again)."""
        raw = self._read()
        real = raw - self._excluded
        t = raw + self._offset
        if self._pending:
            t = self._settle(t)
        return real, t

    def exclude(self, ns: int) -> None:
        """Remove `ns` (a difference of `real_ns()` readings, minus what is charged for
        the work instead) from the timeline."""
        self._offset -= ns
        self._excluded += ns

    def advance_to(self, t_ns: int) -> int:
        """Move the clock forward to `t_ns` if it is behind; return the time jumped."""
        jump = t_ns - self.now()
        if jump > 0:
            self._offset += jump
            return jump
        return 0

    def charge(self, ns: int) -> None:
        """Advance the clock by a modelled cost."""
        self._offset += ns

    def defer(self, ns: int, floor_ns: int) -> None:
        """Take `ns` off the next program interval (add it, if negative), never moving the
        clock to `floor_ns` or below: for costs paid just outside a measured call (the C++ to
        Python boxing of an op) that the program would not pay, or would pay differently."""
        self._pending += ns
        self._floor = max(self._floor, floor_ns)

    def _settle(self, t: int) -> int:
        # Comparisons, not min()/max(): on Python 3.11 those build an argument tuple, an
        # allocation that can start a garbage collection in the middle of a reading.
        pending, self._pending = self._pending, 0
        if pending > 0:
            # Strictly after the floor: a slice ending there (an op, written later in a
            # batch) must end before whatever begins next, or readers pairing begins and
            # ends by time take its end for the end of a slice begun at the same time.
            room = t - self._floor - 1
            if pending > room:
                pending = room if room > 0 else 0  # noqa: FURB136 (no max(): above)
        self._offset -= pending
        return t - pending

    def reset(self) -> None:
        """Make now() read 0 (a modelled recording starts there every time)."""
        self._pending = self._floor = 0
        self._offset = -self._read()

    def origin_unix_ns(self) -> int:
        """Wall-clock time (Unix ns) at which this clock read zero, for trace metadata."""
        if self.source == MODELLED:
            return 0
        return time.time_ns() - self.now()

    # -- sources ----------------------------------------------------------------------

    def use(self, source: str) -> None:
        """Switch the clock's source, keeping now() continuous."""
        if source == LOAD_FREE and not self.schedstat_ok:
            source = WALL  # no per-thread run delay on this system: the limits say so
        # Raw readings stay continuous: an interval measured across the switch (the
        # recording stopping inside a hook) is still right.
        before = self._read()
        self._stop_gc_tracking()
        self.source = source
        if source == WALL:
            self._read = self._wall_ns
            self._base = before - _perf_ns()
        elif source == LOAD_FREE:
            self._read = self._load_free_ns
            self._base = before - (_perf_ns() - self._uncounted)
            self._last_load_free = before
            self._generation += 1  # run delay from before now (between recordings) is not ours
            gc.callbacks.append(self._on_gc)
        else:
            self._read = self._modelled_ns
            self._virtual = before

    def _stop_gc_tracking(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._gc_start = None

    def _wall_ns(self) -> int:
        return _perf_ns() + self._base

    def _modelled_ns(self) -> int:
        return self._virtual

    def _load_free_ns(self) -> int:
        wall = _perf_ns()
        delay = self._threads
        if delay.generation != self._generation:
            self._rebaseline(delay)
        elif wall - delay.last_read > RUN_DELAY_REFRESH_NS:
            self._refresh_run_delay(delay)
        delay.last_read = wall
        # Run delay reaches schedstat at the next scheduling event, so a refresh can take
        # off time that ran before the previous reading: readings still rise (by 1 ns at
        # least), or a range could end before the one nested in it, and an op at a step's
        # end would fall outside it.
        t = wall - self._uncounted + self._base
        if t <= self._last_load_free:
            t = self._last_load_free + 1
        self._last_load_free = t
        return t

    def _rebaseline(self, delay: _ThreadDelay) -> None:
        """This thread's run delay so far, as the baseline of this load-free session."""
        delay.generation = self._generation
        try:
            if delay.fd < 0:
                delay.fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            delay.run_delay = _run_delay(delay.fd)
        except (OSError, ValueError):
            return

    def _refresh_run_delay(self, delay: _ThreadDelay) -> None:
        """Add what this thread waited on the run queue since its last reading."""
        try:
            if delay.fd < 0:
                delay.fd = os.open(_SCHEDSTAT, os.O_RDONLY)
                delay.run_delay = _run_delay(delay.fd)
                return
            run_delay = _run_delay(delay.fd)
        except (OSError, ValueError):
            return
        if run_delay > delay.run_delay:
            self._uncounted += run_delay - delay.run_delay
            delay.run_delay = run_delay

    def after_fork(self) -> None:
        """In a forked child: the inherited schedstat file is the parent's thread's."""
        delay = self._threads
        if delay.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(delay.fd)
        delay.fd = -1
        delay.last_read = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        """GC pauses are left out of the timeline (the time stops), and marked."""
        if phase == "start":
            raw = self._read()
            self._gc_start = (raw, raw - self._excluded, self.now())
            return
        started = self._gc_start
        if started is None:
            return
        self._gc_start = None
        raw = self._read()
        paused = raw - started[0]
        if paused <= 0:
            return
        # An exclusion like any other: what the pause's finalizers excluded (tensors
        # freed) is inside it and is not taken off twice.
        self.exclude(raw - self._excluded - started[1])
        if self.mark_pauses and paused >= GC_MARK_NS and len(self.marks) < _MARKS_LIMIT:
            self.marks.append((f"GC (generation {info.get('generation', '?')})", started[2],
                               paused, {"collected": int(info.get("collected", 0))}))

    def mark(self, name: str, host_ns: int, dur_ns: int, args: dict | None = None) -> None:
        """Note a pause the timeline leaves out (e.g. the recorder writing its file)."""
        if self.mark_pauses and len(self.marks) < _MARKS_LIMIT:
            self.marks.append((name, host_ns, dur_ns, args or {}))

    def take_marks(self) -> list[tuple[str, int, int, dict]]:
        marks, self.marks = self.marks, []
        return marks


clock = HostClock()
os.register_at_fork(after_in_child=clock.after_fork)
