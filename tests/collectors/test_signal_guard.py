"""A signal that lands inside the recorder's begin or end of a slice (#12: the "end without
begin" flake): the handler waits until the trace and the recorder's open slices agree."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from neuron_explorer.collectors import session, signal_guard
from neuron_explorer.collectors.recorder import RecordOptions

from .trace_reading import parse


def _start(path: Path):
    return session.start(RecordOptions(str(path), level="framework", quiet=True),
                         record_children=False)


def _signal_at(recorder, method: str, after: bool = False) -> None:
    """The next call of the writer's `method` gets a real SIGINT just before (or after) it
    writes: as if Ctrl-C came between the recorder noting a slice and writing it."""
    original = getattr(recorder.writer, method)

    def interrupted(*args, **kwargs):
        setattr(recorder.writer, method, original)
        if after:
            original(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # the handler runs right after this call returns
        if not after:
            original(*args, **kwargs)

    setattr(recorder.writer, method, interrupted)


def test_ctrl_c_between_noting_a_slice_and_writing_its_begin(tmp_path: Path) -> None:
    path = tmp_path / "begin.pftrace"
    recorder = _start(path)
    try:
        _signal_at(recorder, "begin")
        with pytest.raises(KeyboardInterrupt):
            recorder.annotation_begin("region")
    finally:
        recorder.stop()
    trace = parse(path)  # fails on an end without its begin
    assert [s.name for s in trace.by_category("annotation")] == ["region"]
    assert [s.name for s in trace.by_category("step")] == ["step 0"]


def test_ctrl_c_between_ending_open_slices_at_a_step_boundary(tmp_path: Path) -> None:
    path = tmp_path / "step.pftrace"
    recorder = _start(path)
    try:
        recorder.annotation_begin("loop")  # open across the step boundary: split there
        _signal_at(recorder, "end", after=True)  # the first open slice's end is written
        with pytest.raises(KeyboardInterrupt):
            recorder.end_step(explicit=True)
    finally:
        recorder.stop()
    trace = parse(path)
    assert [s.name for s in trace.by_category("annotation")] == ["loop", "loop"]
    assert len(trace.by_category("step")) == 2


def test_handlers_are_put_back_when_the_recording_ends(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT)
    recorder = _start(tmp_path / "h.pftrace")
    assert signal.getsignal(signal.SIGINT).__wrapped__ is before
    recorder.stop()
    assert signal.getsignal(signal.SIGINT) is before
    assert signal_guard.deferring(signal.SIG_DFL) is signal.SIG_DFL


def test_a_signal_inside_a_del_is_not_lost() -> None:
    """A `kill` that landed in the host clock's GC callback or a tensor's `__del__` raised
    there, where Python prints the exception as ignored: the recorded program ran on
    (the signal test hung 2 of 3 times). It is sent again once that code has returned."""
    import time

    previous = signal_guard.install()
    try:
        class Dropped:
            def __del__(self) -> None:
                signal.raise_signal(signal.SIGINT)  # the handler runs inside __del__

        with pytest.raises(KeyboardInterrupt):
            Dropped()  # freed at once: its __del__ gets the signal
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the resent signal lands here
                time.sleep(0.001)
    finally:
        signal_guard.restore(previous)


def test_a_signal_inside_a_device_method_called_from_cpp_is_sent_again() -> None:
    """A Ctrl-C that landed in the device guard's Python method, which C++ calls in the
    middle of an op, aborted the process ("terminate called without an active exception";
    `benchmarks/bench_signals.py` saw it in 1 of 120 SIGINTs and SIGTERMs each): the
    handler does not raise there, and the signal is sent again a moment later."""
    import time

    from neuron_explorer.backend import registration

    in_the_guard = _FakeFrame(registration.CALLED_FROM_NATIVE[1].type_.__code__)
    assert signal_guard._swallows_exceptions(in_the_guard)
    assert not signal_guard._swallows_exceptions(_FakeFrame(_FakeFrame.__init__.__code__))
    previous = signal_guard.install()
    try:
        handler = signal.getsignal(signal.SIGINT)
        try:
            handler(signal.SIGINT, in_the_guard)
            raised_in_the_guard = False
        except KeyboardInterrupt:
            raised_in_the_guard = True
        assert not raised_in_the_guard
        with pytest.raises(KeyboardInterrupt):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the resent signal lands here
                time.sleep(0.001)
    finally:
        signal_guard.restore(previous)


class _FakeFrame:
    """What the handler reads of a frame: its code and its caller."""

    def __init__(self, code) -> None:
        self.f_code = code
        self.f_back = None
