"""Errors a user can cause, each with a message that names the thing and the fix."""

from __future__ import annotations


class NeuronExplorerError(Exception):
    """Base of the errors the CLI reports as one clear line (no traceback)."""


class UnknownTableError(NeuronExplorerError, LookupError):
    """An SQL query names a table the trace (or run) does not have."""


class TraceFormatError(NeuronExplorerError):
    """A trace file is empty, truncated, corrupt, too large or of a kind we cannot read.

    `position` is the byte offset of the problem and `event` the index of the event
    (in the file's event list) holding it, where known.
    """

    def __init__(self, path: str, reason: str, position: int | None = None, *,
                 event: int | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.position = position
        self.event = event
        where = ""
        if event is not None:
            where = f" at event {event}"
        elif position is not None:
            where = f" at byte {position}"
        super().__init__(f"cannot read trace {self.path}{where}: {reason}")

    def __reduce__(self) -> tuple:
        # rebuilt from its fields when it crosses a process boundary (runs load ranks in
        # worker processes)
        return (_rebuild, (type(self), self.path, self.reason, self.position, self.event))

class TraceFormatWarning(UserWarning):
    """Part of a trace could not be read and was left out; the rest was loaded."""


class TruncatedTraceWarning(TraceFormatWarning):
    """The trace ends inside an event or a packet (the recording was killed); the complete
    ones were loaded."""


class DamagedTraceWarning(TraceFormatWarning):
    """The trace's packets stop being packets part-way (bytes overwritten on disk or in a
    copy); the packets before the damage were loaded, those after it are lost."""


def _rebuild(cls: type[TraceFormatError], path: str, reason: str, position: int | None,
             event: int | None) -> TraceFormatError:
    return cls(path, reason, position, event=event)
