"""One recording per output: a second `record` given the path another `record` is still
writing is refused, instead of both printing "trace written" and the second silently
replacing the first.

The claim is an advisory POSIX record lock (`lockf`) on a file in the temporary folder
named after the output's absolute path, held by the recording process until it exits (a
process that dies releases it, so a killed recording never blocks the next one). Not
`flock`: a flock is shared with forked children, and DataLoader workers orphaned by a
killed recording would keep holding it.

The recording removes its lock file when it is done (a killed one leaves it, to be reused
by the next recording of that output). A file is removed while its lock is held, and a
claim counts only on the file its path still names, so a recording that opened the file
just before it was removed claims the new one instead of an orphan.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import tempfile

from neuron_explorer.collectors.trace_writer import RecordingError

# the claims held: (descriptor, lock file, the process holding it), open until released
_held: list[tuple[int, str, int]] = []


class OutputInUseError(RecordingError):
    """Another recording is writing the output asked for."""


def claim(path: str) -> bool:
    """Claim `path` for this process's recording; False when another process holds it."""
    lock = lock_file(path)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by another process (EAGAIN or EACCES)
            os.close(fd)
            return False
        if _names(lock, fd):
            break
        os.close(fd)  # its holder removed it as it released it: claim the file there now
    if not _held:
        atexit.register(release)
    _held.append((fd, lock, os.getpid()))
    return True


def lock_file(path: str) -> str:
    """The lock file of the output `path` (relative to the current folder)."""
    key = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), f"neuron-explorer-output-{key}.lock")


def _names(lock: str, fd: int) -> bool:
    """Whether the path `lock` still names the open file `fd`."""
    try:
        here = os.stat(lock)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def release() -> None:
    """The recording is done: give up this process's claims and remove their files."""
    for fd, lock, pid in _held:
        if pid == os.getpid():  # a forked child neither holds the lock nor removes it
            with contextlib.suppress(OSError):
                os.unlink(lock)
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


def claim_or_refuse(path: str) -> None:
    """Claim `path`, or refuse with what to do instead."""
    if not claim(path):
        raise OutputInUseError(f"{path} is being written by another `neuron-explorer record` "
                               "that is still running; give this one another -o, or wait "
                               "for that one to end")
