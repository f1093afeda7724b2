"""Errors a user can cause, each with a message that names the thing and the fix."""

from __future__ import annotations


class NeuronExplorerError(Exception):
    """Base of the errors the CLI reports as one clear line (no traceback)."""


class TraceFormatError(NeuronExplorerError):
    """A trace file is empty, truncated, corrupt or of a kind we cannot read."""

    def __init__(self, path: str, reason: str, position: int | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.position = position
        where = f" at byte {position}" if position is not None else ""
        super().__init__(f"cannot read trace {self.path}{where}: {reason}")

    def __reduce__(self) -> tuple:
        # rebuilt from its fields when it crosses a process boundary (runs load ranks in
        # worker processes)
        return (type(self), (self.path, self.reason, self.position))
