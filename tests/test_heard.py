"""The helper that tests comparing warnings use hears each warning every time, and not
the garbage collector's ResourceWarnings about what other tests left open."""

from __future__ import annotations

import gc
import os
import warnings

from heard import warnings_heard


def _give(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=2)


def test_every_warning_is_heard_each_time_but_no_file_left_to_the_collector():
    read, write = os.pipe()
    os.close(write)
    left_open = [open(read, "rb")]  # noqa: SIM115 (left open: the point)
    left_open.append(left_open)  # a cycle: only a collection finds it
    del left_open
    with warnings_heard() as caught:
        _give("twice")
        _give("twice")
        gc.collect()  # the pipe's ResourceWarning is given here
    assert [str(w.message) for w in caught] == ["twice", "twice"]
