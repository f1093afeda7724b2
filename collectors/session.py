"""The Python API: `neuron_explorer.record(...)`, `step()`, `annotate(...)`, `phase(...)` and
`request(...)`.

    with neuron_explorer.record("run.pftrace", level="op", steps="2:5"):
        for batch in loader:
            with neuron_explorer.annotate("forward+backward"):
                loss = model(batch).sum()
                loss.backward()
            opt.step()              # ends a step, unless neuron_explorer.step() is used

One recording runs at a time per process; child processes started while it runs
are recorded into traces of their own (see `child_processes`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Self

from neuron_explorer.backend.clock import clock
from neuron_explorer.collectors import recording_notices, signal_guard, status_line
from neuron_explorer.collectors.recorder import Recorder, RecordOptions, parse_steps
from neuron_explorer.collectors.trace_writer import RecordingError
from neuron_explorer.common.trace_format import ARG_PHASE, ARG_REQUEST

if TYPE_CHECKING:
    from neuron_explorer.collectors.device_sink import DeviceSink
    from neuron_explorer.collectors.framework_hooks import FrameworkHooks

_perf_ns = clock.real_ns

_active: Recorder | None = None
_attached: dict[int, tuple[FrameworkHooks | None, DeviceSink]] = {}  # id(recorder) -> (hooks, sink)
_signal_handlers: dict[int, dict] = {}  # id(recorder) -> the signal handlers it wrapped


def active() -> Recorder | None:
    """The recording running in this process, if any."""
    return _active if _active is not None and not _active.stopped else None


def format_for(path: str, fmt: str | None) -> str:
    """The format asked for, or the one the file name implies (.json -> json)."""
    if fmt:
        return fmt
    return "json" if str(path).lower().endswith(".json") else "pftrace"


def _steps(steps: str | Sequence[int] | range | None) -> tuple[int, int | None] | None:
    if steps is None or isinstance(steps, str):
        return parse_steps(steps)
    if isinstance(steps, range):
        return parse_steps(f"{steps.start}:{steps.stop}")
    start, stop = steps
    return parse_steps(f"{start}:{'' if stop is None else stop}")


def start(options: RecordOptions, *, record_children: bool = True) -> Recorder:
    """Start recording this process (the CLI and `record` both come here)."""
    global _active
    running = active()
    if running is not None:
        raise RecordingError(f"already recording to {running.options.path}: "
                             "stop that recording before starting another")
    import torch  # noqa: F401 - loads the neuron device before its events are subscribed
    from neuron_explorer.backend.clock import LOAD_FREE
    from neuron_explorer.backend.events import hub
    from neuron_explorer.collectors import child_processes
    from neuron_explorer.collectors.device_sink import DeviceSink
    from neuron_explorer.collectors.framework_hooks import FrameworkHooks

    _start_host_clock()
    try:
        recorder = Recorder(options)
    except BaseException:
        _stop_host_clock()
        raise
    # pauses are marked from the metadata on (it is the trace's first event)
    clock.take_marks()
    clock.mark_pauses = clock.source == LOAD_FREE
    _signal_handlers[id(recorder)] = signal_guard.install()
    hooks = FrameworkHooks(recorder)
    sink = DeviceSink(recorder, hooks)
    recorder.flush_buffers = sink.flush
    hooks.install()
    hub.subscribe(sink, instruction_arrays=recorder.engine)
    _attached[id(recorder)] = (hooks, sink)
    _active = recorder
    child_processes.install_fork_handler()
    if record_children:
        child_processes.export_to_children(options)
    recording_notices.install_slow_op_notice()
    if not options.quiet and status_line.wanted():
        recorder.status = status_line.StatusLine(recorder)
        recorder.status.start()
    return recorder


_measured_costs: list[int] = []  # (boxing ns per op, module hook ns per call)


def _start_host_clock() -> None:
    """Switch the host clock to the source NEURON_HOST_CLOCK asks for (load-free by
    default) and measure the per-op costs that are ours, not the program's."""
    from neuron_explorer.backend import devices
    from neuron_explorer.backend.clock import LOAD_FREE, MODELLED, requested_source
    from neuron_explorer.backend.host_costs import (
        host_costs,
        measure_boxing_ns,
        measure_module_hook_ns,
    )

    try:
        source = requested_source()
    except ValueError as exc:
        raise RecordingError(str(exc)) from None
    clock.take_marks()  # an earlier recording's
    if source == MODELLED:
        clock.use(MODELLED)
        clock.reset()  # every modelled recording starts at 0
        devices.restart_clocks()  # ... and so do the devices' queues
        host_costs.configure(MODELLED)
        return
    clock.use(source)
    boxing = hook = 0
    if clock.source == LOAD_FREE:
        if not _measured_costs:  # once per process: they do not change
            host_start = clock.now()
            _measured_costs.extend((measure_boxing_ns(), measure_module_hook_ns()))
            clock.exclude(clock.now() - host_start)  # measuring is not the program's time
        boxing, hook = _measured_costs
    host_costs.configure(clock.source, boxing, hook)


def _stop_host_clock() -> None:
    """Back to the plain wall clock, the cheapest, once nothing records."""
    from neuron_explorer.backend.clock import WALL
    from neuron_explorer.backend.host_costs import host_costs

    clock.mark_pauses = False  # the recorder writes the marks still held as it closes
    clock.use(WALL)
    host_costs.configure(WALL)


def attach_sink_after_fork(recorder: Recorder) -> None:
    """In a forked child: the inherited sink points at the parent's tracks; replace it."""
    from neuron_explorer.backend.events import hub
    from neuron_explorer.collectors.device_sink import DeviceSink

    hooks, old_sink = _attached.pop(id(recorder), (None, None))
    if old_sink is not None:
        hub.unsubscribe(old_sink)
    sink = DeviceSink(recorder, hooks)
    recorder.flush_buffers = sink.flush
    hub.subscribe(sink, instruction_arrays=recorder.engine)
    _attached[id(recorder)] = (hooks, sink)


def detach(recorder: Recorder) -> None:
    """Unsubscribe and unhook a recorder, writing what its sink still buffers."""
    global _active
    from neuron_explorer.backend.events import hub

    signal_guard.restore(_signal_handlers.pop(id(recorder), {}))
    hooks, sink = _attached.pop(id(recorder), (None, None))
    if sink is not None:
        hub.unsubscribe(sink)
        if recorder.failed is None:
            sink.flush()
    if hooks is not None:
        hooks.uninstall()
    if _active is recorder:
        _active = None
        from neuron_explorer.collectors import child_processes

        child_processes.stop_exporting()
        recording_notices.remove_slow_op_notice()
        _stop_host_clock()


class record(contextlib.ContextDecorator):
    """Record the enclosed code into a trace: `with neuron_explorer.record("run.pftrace"):`.

    path: the trace file (default: a new trace.pftrace in the current folder);
    level: "framework", "op" or "engine" (default); steps: "START:STOP" (or a
    (start, stop) pair or range) records only those steps; format: "pftrace" or
    "json" (default: from the file name).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, level: str = "engine",
                 steps: str | Sequence[int] | range | None = None, format: str | None = None,
                 quiet: bool = False) -> None:
        if path is None:  # a new file in the current folder, never an existing one
            from neuron_explorer.collectors.record_command import default_output

            path = default_output("trace", format or "pftrace")
        path = os.fspath(path)
        self.options = RecordOptions(path, level, _steps(steps), format_for(path, format),
                                     quiet=quiet)
        self.recorder: Recorder | None = None

    @property
    def path(self) -> str:
        return self.options.path

    def start(self) -> Self:
        self.recorder = start(self.options)
        return self

    def stop(self) -> None:
        if self.recorder is not None:
            self.recorder.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StepMark:
    """What `step()` returns: nothing to use, but `with neuron_explorer.step():` says how
    steps are marked instead of failing on None."""

    def __enter__(self) -> None:
        raise TypeError(
            "neuron_explorer.step() marks where a step ends: call it once at the end of each "
            "step or request (`neuron_explorer.step()`), not as a `with` block; to name a "
            "stretch of code, use `with neuron_explorer.annotate(name):`")

    def __exit__(self, *exc: object) -> None:
        return None


def step() -> StepMark:
    """Mark the end of a training step (overrides the optimizer-step default)."""
    recorder = active()
    if recorder is None:
        return StepMark()
    t0, ts = clock.stamp()
    try:
        recorder.end_step(explicit=True, ts=ts)
    except RecordingError as exc:
        recorder.fail(exc)
    clock.exclude(_perf_ns() - t0)
    return StepMark()


class annotate(contextlib.ContextDecorator):
    """A named range in the trace: `with annotate("loss"):` or `@annotate("loss")`."""

    def __init__(self, name: str) -> None:
        self.name = str(name)
        self.args: dict[str, str] = {}  # written on the range beside its step
        self._recorder: Recorder | None = None

    def _recreate_cm(self) -> annotate:
        return annotate(self.name)  # each decorated call gets its own range

    def __enter__(self) -> Self:
        recorder = active()
        if recorder is not None and recorder.recording:
            t0, ts = clock.stamp()
            try:
                recorder.annotation_begin(self.name, ts=ts, args=self.args)
                self._recorder = recorder
            except RecordingError as exc:
                recorder.fail(exc)
            clock.exclude(_perf_ns() - t0)
        return self

    def __exit__(self, *exc: object) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is not None and not recorder.stopped:
            t0, ts = clock.stamp()
            try:
                recorder.annotation_end(ts=ts)
            except RecordingError as err:
                recorder.fail(err)
            clock.exclude(_perf_ns() - t0)


class phase(annotate):
    """Mark a phase of the run: `with neuron_explorer.phase("prefill"):`. The steps that
    start their model call inside it are that phase in `Trace.phases()` (train, eval,
    prefill, decode, or a name of yours), whatever the explorer would have read."""

    def __init__(self, name: str) -> None:
        super().__init__(f"phase: {name}")
        self.phase = str(name)
        self.args = {ARG_PHASE: self.phase}

    def _recreate_cm(self) -> phase:
        return phase(self.phase)


class request(annotate):
    """Mark the request(s) a model call serves: `with neuron_explorer.request(7):`, or one
    id per batch row, `with neuron_explorer.request([3, 7, 9]):` (row 0 serves request 3).
    `Trace.requests()` gives each request's time to first token and per output token from
    the calls it marks. The first range naming a request is its arrival: entered when the
    request comes in, even with no call in it, it shows the request's time in the queue."""

    def __init__(self, ids: int | str | Sequence[int | str]) -> None:
        given: list[object] = list(ids) if isinstance(ids, list | tuple) else [ids]
        self.ids = [i for i in given if isinstance(i, int | str) and not isinstance(i, bool)]
        if len(self.ids) != len(given):
            raise TypeError("neuron_explorer.request takes an id or a list of ids (int or str)")
        # one name for every request range: the report's regions table shows them as one
        # region, and the ids are in the range's args
        super().__init__("request")
        self.args = {ARG_REQUEST: json.dumps(self.ids)}

    def _recreate_cm(self) -> request:
        return request(self.ids)
