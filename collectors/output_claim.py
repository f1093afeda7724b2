"""One recording per output: a second `record` given the path another `record` is still
writing is refused, instead of both printing "trace written" and the second silently
replacing the first.

The claim is an advisory POSIX record lock (`lockf`) on a file in the temporary folder
named after the output's absolute path, held by the recording process until it exits (a
process that dies releases it, so a killed recording never blocks the next one). Not
`flock`: a flock is shared with forked children, and DataLoader workers orphaned by a
killed recording would keep holding it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile

from neuron_explorer.collectors.trace_writer import RecordingError

_held: list[int] = []  # descriptors of the claims this process holds, open until it exits


class OutputInUseError(RecordingError):
    """Another recording is writing the output asked for."""


def claim(path: str) -> bool:
    """Claim `path` for this process's recording; False when another process holds it."""
    key = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:20]
    lock = os.path.join(tempfile.gettempdir(), f"neuron-explorer-output-{key}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process (EAGAIN or EACCES)
        os.close(fd)
        return False
    _held.append(fd)
    return True


def claim_or_refuse(path: str) -> None:
    """Claim `path`, or refuse with what to do instead."""
    if not claim(path):
        raise OutputInUseError(f"{path} is being written by another `neuron-explorer record` "
                               "that is still running; give this one another -o, or wait "
                               "for that one to end")
