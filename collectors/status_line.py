"""A one-line live status on stderr while `record` runs (only when stderr is a terminal).

    neuron-explorer: recording · 12 steps · 3.2 MiB · 41 s

A daemon thread redraws the line twice a second with a carriage return and clears it
before the summary. It reads a few counters of the recorder without locking: a stale
figure for half a second is harmless, and the program's own thread is never made to
wait for it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, TYPE_CHECKING

from neuron_explorer.collectors.recording_notices import trace_bytes
from neuron_explorer.collectors.summary import human_size

if TYPE_CHECKING:
    from neuron_explorer.collectors.recorder import Recorder

REFRESH_S = 0.5
_CLEAR = "\r\x1b[K"


def wanted(stream: IO[str] | None = None) -> bool:
    """A live line only makes sense on a terminal (not in a log file or a pipe)."""
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class StatusLine:
    """The live line for one recording."""

    def __init__(self, recorder: Recorder, stream: IO[str] | None = None) -> None:
        self.recorder = recorder
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="neuron-explorer status",
                                        daemon=True)
        self._drawn = False

    def start(self) -> None:
        self._thread.start()

    def text(self) -> str:
        rec = self.recorder
        steps = len(rec.steps_completed)
        elapsed = time.monotonic() - self._started
        return (f"neuron-explorer: recording · {steps} step{'s' if steps != 1 else ''} · "
                f"{human_size(trace_bytes(rec))} · {elapsed:.0f} s")

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.stream.write(_CLEAR + self.text())
                self.stream.flush()
                self._drawn = True
            except (OSError, ValueError):
                return

    def stop(self) -> None:
        """Stop redrawing and clear the line (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self._drawn:
            try:
                self.stream.write(_CLEAR)
                self.stream.flush()
            except (OSError, ValueError):
                pass
