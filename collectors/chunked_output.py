"""The buffered file both trace writers share: whole events in, chunks out.

Events are buffered until about `chunk_bytes` have gathered, then written (and flushed)
in one go, so a killed run leaves a file cut between events, never inside one. A write
that fails (a full disk) closes the file and raises one RecordingError; what was
written before stays readable.
"""

from __future__ import annotations

import contextlib
from typing import Any

from neuron_explorer.collectors import signal_guard
from neuron_explorer.collectors.trace_writer import open_output, write_failed


class ChunkedOutput:
    """`path` opened for writing, with the buffer, flush, close and discard of a writer.

    Subclasses append whole events to `_buffer` (adding their size to `_buffered`) through
    `_emit`, or inline on a hot path, and may add what ends the file in `_finish`.
    """

    def __init__(self, path: str, chunk_bytes: int, create_on_write: bool = False) -> None:
        self.path = str(path)
        # `create_on_write`: the file is made by the first write (a child process that
        # records nothing, or is killed before it writes, leaves no empty file behind)
        self._file = None if create_on_write else open_output(self.path)
        self._chunk_bytes = chunk_bytes
        self._buffer: list[Any] = []
        self._buffered = 0
        self.bytes_written = 0
        self.closed = False

    def _encode(self, parts: list[Any]) -> bytes:
        """The buffered parts as the bytes to write."""
        return b"".join(parts)

    def _emit(self, data: Any) -> None:
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered >= self._chunk_bytes:
            self.flush()

    def _finish(self) -> None:
        """What ends the file, emitted on close (nothing by default)."""

    def flush(self) -> None:
        """Write the buffered events to the file (whole events only). A Ctrl-C or `kill`
        that lands here waits until they are written: raised between taking the buffer and
        writing it, it would lose the events taken (`signal_guard`)."""
        if not self._buffer or self.closed:
            return
        signal_guard.enter()
        try:
            data = self._encode(self._buffer)
            self._buffer.clear()
            self._buffered = 0
            try:
                if self._file is None:
                    self._file = open_output(self.path)
                self._file.write(data)
                self._file.flush()
            except OSError as exc:
                self._abandon()
                raise write_failed(self.path, exc) from None
            self.bytes_written += len(data)
        finally:
            signal_guard.leave()

    def close(self) -> None:
        """End the file, flush what is buffered and close it (idempotent)."""
        if self.closed:
            return
        try:
            self._finish()
            self.flush()
        finally:
            self._abandon()

    def discard(self) -> None:
        """Forget buffered events and close without writing them (a forked child's copy)."""
        self._buffer.clear()
        self._buffered = 0
        self._abandon()

    def _abandon(self) -> None:
        self.closed = True
        self._buffer.clear()
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
