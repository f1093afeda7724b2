"""One recording: the writer, the host and device tracks, the step window, open slices.

The framework hooks and the device sink call the recorder; the recorder decides
what is inside the step window, keeps host slices properly nested per thread
(steps, modules, backward, annotations), and writes through a `TraceWriter`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_explorer.backend.clock import MODELLED, clock
from neuron_explorer.collectors import signal_guard
from neuron_explorer.collectors.dataloader_workers import WorkerTracks
from neuron_explorer.collectors.recording_notices import host_clock_metadata, warn_if_large
from neuron_explorer.collectors.trace_writer import RecordingError, TraceWriter, open_writer
from neuron_explorer.common.trace_format import (
    ARG_PAUSED_NS,
    ARG_STEP,
    CAT_ANNOTATION,
    CAT_BACKWARD,
    CAT_STEP,
    CAT_UNCOUNTED,
    FORMAT_VERSION,
    LEVELS,
    META_COMMAND,
    META_COMPLETE,
    META_END_MARK,
    META_EXIT_CODE,
    META_HARDWARE,
    META_HARDWARE_FIGURES,
    META_HOST_CLOCK,
    META_HOST_CPUS,
    META_LEVEL,
    META_PID,
    META_PROGRAM_ERROR,
    META_START,
    META_TORCH,
    META_VERSION,
    TRACK_UNCOUNTED,
)

_FLUSH_EVERY_S = 0.5  # at most this old: the events a killed run loses


@dataclass
class RecordOptions:
    """What to record and where: the plain config object behind `record()` and the CLI."""

    path: str
    level: str = "engine"
    steps: tuple[int, int | None] | None = None  # [start, stop) step window
    fmt: str = "pftrace"
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    quiet: bool = False  # no summary on stderr
    drop_if_empty: bool = False  # a child process that recorded nothing leaves no file

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise RecordingError(f"unknown level {self.level!r}: use one of {', '.join(LEVELS)}")


@dataclass
class _Open:
    """A host slice begun on a thread's track and not yet ended."""

    name: str
    category: str
    args: Mapping[str, Any] | None


class ThreadState:
    __slots__ = ("backward", "forward", "open", "track")

    def __init__(self, track: int) -> None:
        self.track = track
        self.open: list[_Open] = []  # host slices open on this track, outermost first
        self.forward: list[tuple[str, int, int]] = []  # (path, autograd seq at entry, id)
        self.backward: list[str] = []  # module paths of the backward slices open


def parse_steps(text: str | None) -> tuple[int, int | None] | None:
    """"START:STOP" (either side may be empty) -> (start, stop); None -> None."""
    if text is None:
        return None
    start_text, sep, stop_text = text.partition(":")
    try:
        start = int(start_text) if start_text.strip() else 0
        stop = int(stop_text) if stop_text.strip() else None
    except ValueError:
        start = stop = -1
    if not sep or start < 0 or (stop is not None and stop <= start):
        raise RecordingError(
            f"--steps {text!r} is not a step range: use START:STOP with 0 <= START < STOP, "
            "e.g. --steps 2:5 records steps 2, 3 and 4"
        )
    return start, stop


def _usable_cpus() -> int:
    """The cores this process may run on (its affinity where the system has one: macOS has
    none, and os.cpu_count() counts them all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


class Recorder:
    """Writes one process's events into one trace file."""

    def __init__(self, options: RecordOptions) -> None:
        self._reset(options)

    def _reset(self, options: RecordOptions) -> None:
        """Start the recording of `options` from nothing (`after_fork` starts over in this
        same object, which the hooks and the device sink hold)."""
        self.options = options
        self.level = LEVELS.index(options.level)
        self.ops = self.level >= 1  # op slices and kernels
        self.engine = self.level >= 2  # instructions, DMA, counters
        # Modelled runs write the same ids every time: pids and thread ids are run-specific
        self.modelled = clock.source == MODELLED
        self.pid = _modelled_pid() if self.modelled else os.getpid()
        self.writer: TraceWriter = open_writer(options.path, options.fmt,
                                               uuid_base=(self.pid << 24) + 1,
                                               create_on_write=options.drop_if_empty)
        self._uncounted_track: int | None = None
        self._marks_written = 0  # GC and recording pauses: a trace of only these is empty
        self.status: Any = None  # the live status line, when stderr is a terminal
        self.large_trace_warned = False
        self.failed: RecordingError | None = None
        self.stopped = False
        self.step = 0
        self.explicit_steps = False
        self.step_boundary: str | None = None  # what ends steps: explicit, optimizer, forward
        self.step_open = False
        self.step_start = clock.now()
        self.first_event_ts: int | None = None  # first device event of a step not yet begun
        self.exit_code = 0  # the program's, and the error that ended it (`program_ended`)
        self.program_error: str | None = None
        # host slices that open no step (syncs), met while none is open: (start, write)
        self._between_steps: list[tuple[int, Callable[[], None]]] = []
        self.steps_recorded: list[int] = []  # steps with events (the last may be unfinished)
        self.steps_completed: list[int] = []  # ended by a step mark
        # steps before (and the one ended by) the first `neuron_explorer.step()` where the
        # model's returns had ended steps until then: pieces of the first iteration
        self.steps_before_marks = 0
        self.optimizer_step_compiled = False  # traced by torch.compile: it marks no steps
        self.window_start, self.window_stop = options.steps or (0, None)
        self._update_recording()  # sets `recording`
        self._threads: dict[int, ThreadState] = {}
        self._lock = threading.RLock()
        self.main_ident = threading.main_thread().ident
        self.flush_buffers: Callable[[], None] | None = None  # the device sink's batches
        self._last_flush = self._flush_clock()
        self.host = self.writer.process(self.pid, _process_name(options.command),
                                        [str(a) for a in options.command])
        self.main = self._thread_state_for(self.main_ident, threading.main_thread())
        self.workers = WorkerTracks(self)
        self.writer.metadata(self.main.track, clock.now(), self._metadata())

    # -- state --------------------------------------------------------------------

    def _update_recording(self) -> None:
        """`recording`: events are to be written (inside the step window, not stopped). A
        plain attribute, not a property: every device event reads it."""
        self.recording = not self.stopped and self.step >= self.window_start

    def _metadata(self) -> dict[str, Any]:
        import torch
        from neuron_explorer import __version__

        hardware, figures = hardware_preset()
        return {
            META_HARDWARE: hardware,
            META_HARDWARE_FIGURES: figures,
            META_COMMAND: [str(a) for a in self.options.command],
            META_TORCH: torch.__version__,
            META_VERSION: __version__,
            META_START: clock.origin_unix_ns(),
            META_LEVEL: self.options.level,
            META_PID: self.pid,
            META_HOST_CPUS: _usable_cpus(),
            META_HOST_CLOCK: host_clock_metadata(),
            "steps": list(self.options.steps) if self.options.steps else None,
            "format_version": FORMAT_VERSION,
            META_END_MARK: True,  # _close writes META_COMPLETE: its absence means cut short
        }

    def thread(self) -> ThreadState:
        """The calling thread's state, its track registered on first use."""
        ident = threading.get_ident()
        state = self._threads.get(ident)
        if state is None:
            state = self._thread_state_for(ident, threading.current_thread())
        return state

    def thread_for(self, ident: int) -> ThreadState:
        state = self._threads.get(ident)
        if state is None:
            return self.thread()  # events arrive on the thread that caused them
        return state

    def _thread_state_for(self, ident: int | None, thread: threading.Thread) -> ThreadState:
        with self._lock:
            if self.modelled:
                native = self.pid + len(self._threads)  # in the order threads show up
            else:
                native = getattr(thread, "native_id", None) or threading.get_native_id()
            name = thread.name if thread is not threading.main_thread() else "MainThread"
            state = ThreadState(self.writer.thread(self.pid, native, name))
            self._threads[ident or 0] = state
            return state

    def step_args(self) -> dict[str, int]:
        return {ARG_STEP: self.step}

    # -- host slices, kept nested per thread -------------------------------------------

    def ensure_step(self, activity: bool = True, ts: int | None = None) -> None:
        """Begin the current step's slice, lazily, at the first training activity in it (a
        module, backward, optimizer, data-loader, annotation or compile event). Device ops
        and syncs alone open no step: setup before the loop (imports, model.to, building
        the optimizer) and the code after the last step mark stay outside every step.
        The first step starts at that activity; later ones where the previous one ended."""
        if self.step_open or not self.recording:
            return
        now = clock.now() if ts is None else ts
        if not activity:
            # events can reach the sink after later ones (batched): keep the earliest
            if self.first_event_ts is None or now < self.first_event_ts:
                self.first_event_ts = now
            return
        start = self.step_start
        if not self.steps_completed and self.step == 0:
            start = now
        elif not self.steps_completed and self.first_event_ts is not None:
            # the first step of a --steps window: no recorded step before it, so it can
            # reach back to hold every device event it saw (the window never cuts a step)
            start = min(start, self.first_event_ts)
        signal_guard.enter()
        try:
            self._write_between_steps(before=start)
            self.step_open = True
            self.writer.begin(self.main.track, start, f"step {self.step}", CAT_STEP,
                              {ARG_STEP: self.step})
            self.steps_recorded.append(self.step)
            self._write_between_steps()
        finally:
            signal_guard.leave()

    def write_host_slice(self, start: int, write: Callable[[], None]) -> None:
        """Write a host slice that opens no step (a sync): at once inside a step; while none
        is open, once one opens or the recording ends. A step begins where the one before
        ended, so one opening after such a slice can begin at the slice's own start: its
        begin must come first in the file to hold it (a `synchronize()` after the optimizer
        step, written first, held the next step and broke every step's window)."""
        if self.step_open:
            write()
        else:
            self._between_steps.append((start, write))

    def _write_between_steps(self, before: int | None = None) -> None:
        """Write the slices kept by `write_host_slice`: those starting before `before`
        (outside the step beginning there), or all."""
        kept = []
        for start, write in self._between_steps:
            if before is None or start < before:
                write()
            else:
                kept.append((start, write))
        self._between_steps = kept

    def begin(self, name: str, category: str, args: Mapping[str, Any] | None = None,
              ts: int | None = None, state: ThreadState | None = None) -> None:
        """Open a host slice on the calling thread's track."""
        if not self.recording:
            return
        signal_guard.enter()  # the slice noted open and its begin written, or neither
        try:
            self.ensure_step(ts=ts)
            state = state or self.thread()
            state.open.append(_Open(name, category, args))
            self.writer.begin(state.track, clock.now() if ts is None else ts, name, category, args)
        finally:
            signal_guard.leave()

    def end(self, category: str, ts: int | None = None, state: ThreadState | None = None) -> None:
        """Close the innermost open slice of `category` (and any left open inside it)."""
        state = state or self.thread()
        for depth in range(len(state.open) - 1, -1, -1):
            if state.open[depth].category == category:
                now = clock.now() if ts is None else ts
                signal_guard.enter()
                try:
                    while len(state.open) > depth:
                        state.open.pop()
                        self.writer.end(state.track, now)
                finally:
                    signal_guard.leave()
                return

    def end_step(self, explicit: bool, ts: int | None = None, by: str = "optimizer") -> None:
        """End the current step: by `neuron_explorer.step()`, an optimizer step or (`by` =
        "forward", inference loops) the return of the outermost module's forward."""
        signal_guard.enter()  # the open slices split at the boundary all at once, or not
        try:
            self._end_step(explicit, ts, by)
        finally:
            signal_guard.leave()

    def _end_step(self, explicit: bool, ts: int | None, by: str) -> None:
        if explicit:
            first_mark = not self.explicit_steps
            self.explicit_steps = True
            if first_mark and self.step_boundary == "forward":
                self.steps_before_marks = self.step + 1
            if (first_mark and self.steps_completed and not self.step_open
                    and self.first_event_ts is None):
                # nothing ran since the optimizer step or the model's return that just
                # ended a step: this first mark ends that step too, not an empty one of its own
                self.step_boundary = "explicit"
                return
            if first_mark and self.step_boundary == "optimizer" and self.steps_completed:
                # optimizer steps ended steps before it: those and the one it ends are
                # pieces of the first iteration (a GAN's two optimizers split it in three)
                self.steps_before_marks = self.step + 1
            by = "explicit"
        elif self.explicit_steps:
            return  # explicit step marks override optimizer steps
        elif by == "forward" and self.step_boundary == "optimizer":
            return  # a training loop: its optimizer steps end the steps
        self.step_boundary = by
        now = clock.now() if ts is None else ts
        if explicit and not self.step_open and self.recording:
            # an explicit step holds whatever ran since the last mark, activity or not
            start = self.first_event_ts if self.step == 0 and not self.steps_completed else None
            self.ensure_step(ts=min(start, now) if start is not None else self.step_start)
        reopen: list[_Open] = []
        if self.step_open:
            # Slices still open on the main thread (a loop-wide annotation) are split at the
            # step boundary so that every slice nests inside one step.
            reopen = [o for o in self.main.open]
            for _ in self.main.open:
                self.writer.end(self.main.track, now)
            self.main.open.clear()
            self.writer.end(self.main.track, now)
            self.step_open = False
            self.steps_completed.append(self.step)
            # a killed run keeps the steps completed up to half a second before; batches
            # stay large enough to be cheap. The first step's own slices reach the file
            # at once (a write, no encoding).
            real = self._flush_clock()
            if real - self._last_flush >= _FLUSH_EVERY_S:
                self._last_flush = real
                self.flush()
            elif len(self.steps_completed) == 1:
                self.writer.flush()
        self.step += 1
        self._update_recording()
        self.step_start = now
        self.first_event_ts = None
        if self.window_stop is not None and self.step >= self.window_stop:
            self.stop()
            return
        if reopen and self.recording:
            for o in reopen:
                self.begin(o.name, o.category, o.args, ts=now, state=self.main)

    # -- backward module slices (from the autograd node running each op) -------------

    def backward_to(self, path: str, ts: int, state: ThreadState) -> None:
        """Make the open backward module slices of this thread match `path`'s hierarchy."""
        if not self.recording:
            return
        want = _path_levels(path)
        have = state.backward
        if len(have) == len(want) and (not want or have[-1] == want[-1]):
            return  # the same module as the op before (levels follow from the innermost)
        common = 0
        while common < len(have) and common < len(want) and have[common] == want[common]:
            common += 1
        while len(have) > common:
            have.pop()
            self.end(CAT_BACKWARD, ts, state)
        for level in want[common:]:
            have.append(level)
            self.begin(level, CAT_BACKWARD,
                       {"module": level, "phase": "backward", ARG_STEP: self.step},
                       ts=ts, state=state)

    def close_backward(self, ts: int | None = None, state: ThreadState | None = None) -> None:
        """End the backward module slices open on `state` (default: on every thread)."""
        for st in [state] if state is not None else list(self._threads.values()):
            now = clock.now() if ts is None else ts
            while st.backward:
                st.backward.pop()
                self.end(CAT_BACKWARD, now, st)

    # -- annotations ----------------------------------------------------------------

    def annotation_begin(self, name: str, ts: int | None = None,
                         args: Mapping[str, Any] | None = None) -> None:
        self.begin(name, CAT_ANNOTATION, {**self.step_args(), **(args or {})}, ts=ts)

    def annotation_end(self, ts: int | None = None) -> None:
        self.end(CAT_ANNOTATION, ts=ts)

    # -- end ------------------------------------------------------------------------

    def _flush_clock(self) -> float:
        """Seconds by which flushes are scheduled: real time, or the host clock in a
        modelled run (batch boundaries then fall at the same events every time)."""
        return clock.now() / 1e9 if self.modelled else time.perf_counter()

    def flush(self) -> None:
        """Write everything buffered so far to the file (its time is off the clock and
        marked on the host's "not counted" track)."""
        real_start, host_now = clock.real_ns(), clock.now()
        if self.flush_buffers is not None:
            self.flush_buffers()
        self.writer.flush()
        clock.mark("recorder: writing the trace", host_now, clock.real_ns() - real_start)
        self.write_marks()
        warn_if_large(self)

    def write_marks(self, closing: bool = False) -> None:
        """Write the pauses the host clock left out (GC, the recorder's own writing) as
        instants with their real length, on a track of their own."""
        marks = clock.take_marks()
        if not marks or not (self.recording or closing):
            return
        if self._uncounted_track is None:
            self._uncounted_track = self.writer.track(TRACK_UNCOUNTED, self.host)
        self._marks_written += len(marks)
        for name, ts, dur, args in marks:
            self.writer.instant(self._uncounted_track, ts, name, CAT_UNCOUNTED,
                                {ARG_PAUSED_NS: int(dur), **args})

    def fail(self, error: RecordingError) -> None:
        """Writing failed (e.g. a full disk): stop recording, keep the program running."""
        if self.failed is None:
            self.failed = error
            print(f"neuron-explorer: {error}", file=sys.stderr)
        self.stopped = True
        self._update_recording()

    def stop(self) -> None:
        """End open slices, flush and close the trace (idempotent)."""
        from neuron_explorer.collectors import session

        if self.stopped and self.writer.closed:
            session.detach(self)  # a failed write closed the writer: still unsubscribe
            return
        if self.status is not None:
            self.status.stop()
        was_failed = self.failed is not None
        self.stopped = True
        self._update_recording()
        now = clock.now()  # before detaching, which hands the clock back to wall time
        session.detach(self)
        if was_failed:
            self.workers.close(0, 0, write=False)
            self.writer.discard()
            return
        signal_guard.enter()  # a second Ctrl-C waits until the trace is complete
        try:
            self._close(now)
        finally:
            signal_guard.leave()

    def program_ended(self, code: int, error: str | None) -> None:
        """How the recorded program ended, for the end mark: a report of a run that
        crashed says so beside what it recorded."""
        self.exit_code, self.program_error = code, error

    def _close(self, now: int) -> None:
        """Write the end of everything still open and close the file."""
        try:
            self.workers.close(time.perf_counter_ns(), now)
            self.write_marks(closing=True)
            self._write_between_steps()
            for state in self._threads.values():
                while state.open:
                    state.open.pop()
                    self.writer.end(state.track, now)
                state.backward.clear()
            if self.step_open:
                self.writer.end(self.main.track, now)
                self.step_open = False
            written = self.writer.events  # before the end mark, which is no content
            end: dict[str, Any] = {META_COMPLETE: True}
            if self.exit_code:
                end[META_EXIT_CODE] = self.exit_code
                if self.program_error:
                    end[META_PROGRAM_ERROR] = self.program_error
            if self.steps_recorded:
                # which steps a mark ended: the explorer leaves the code after the last out
                end.update(steps_completed=self.steps_completed,
                           step_boundary=self.step_boundary)
                if self.steps_before_marks:
                    end.update(steps_before_marks=self.steps_before_marks)
            self.writer.metadata(self.main.track, now, end)
            self.writer.close()
        except RecordingError as exc:
            self.fail(exc)
            self.writer.discard()
            return
        if self.options.drop_if_empty and written - self._marks_written <= 1:
            with contextlib.suppress(OSError):
                os.unlink(self.writer.path)
            return
        if not self.options.quiet:
            from neuron_explorer.collectors.summary import summary

            print(summary(self), file=sys.stderr)

    def after_fork(self, path: str) -> None:
        """In a forked child: drop the parent's buffered events, start a trace of our own."""
        self.writer.discard()
        self._reset(RecordOptions(path, self.options.level, self.options.steps,
                                    self.options.fmt, self.options.command, quiet=True,
                                    drop_if_empty=True))


@functools.lru_cache(maxsize=4096)
def _path_levels(path: str) -> tuple[str, ...]:
    """"model.layers.3" -> ("model", "model.layers", "model.layers.3") ("" -> ())."""
    if not path:
        return ()
    parts = path.split(".")
    return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))


def _modelled_pid() -> int:
    """A modelled run's process id in the trace: 1, or 1 + RANK for a rank."""
    try:
        return 1 + int(os.environ.get("RANK", "0"))
    except ValueError:
        return 1


def _process_name(command: list[str]) -> str:
    shown = [os.path.basename(str(command[0]))] + [str(a) for a in command[1:3]] if command else []
    return " ".join(shown) or "python"


def hardware_preset() -> tuple[str, dict[str, Any]]:
    """The device preset's name and peak figures (from the device when it is available)."""
    name = os.environ.get("NEURON_HARDWARE", "trn2")
    try:
        from neuron_explorer.backend import devices

        preset = devices.preset()
        figures = preset.figures()
        return preset.name, json.loads(json.dumps(figures, default=str))
    except Exception:  # noqa: BLE001 - no device here: keep the name we know
        return name, {}

