"""The claim on a recording's output is the recording process's own: a forked child
(a DataLoader worker) does not hold it after the recording process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuron_explorer.collectors.output_claim import claim, release

FORK_AND_EXIT = r'''
import os, sys, time
from neuron_explorer.collectors.output_claim import claim
assert claim(sys.argv[1])
if os.fork() == 0:  # a worker that outlives the recording, as orphans of a killed one do
    time.sleep(5)
    os._exit(0)
os._exit(0)
'''


def test_a_forked_child_does_not_keep_the_claim(tmp_path):
    out = str(tmp_path / "run.pftrace")
    subprocess.run([sys.executable, "-c", FORK_AND_EXIT, out], check=True, timeout=60)
    time.sleep(0.2)
    assert claim(out)  # free, though the child still runs
    release()


def _lock_files() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("neuron-explorer-output-*.lock")}


def test_a_released_claim_leaves_no_file_and_the_next_claim_gets_it(tmp_path):
    out = str(tmp_path / "run.pftrace")
    before = _lock_files()
    assert claim(out)
    (mine,) = _lock_files() - before
    release()
    assert mine not in _lock_files()  # nothing left in the temporary folder
    assert claim(out)
    release()


def test_a_claim_on_a_file_removed_as_it_was_released_moves_to_the_new_file(
        tmp_path, monkeypatch):
    """A second recording opened the lock file just before the first removed it and
    released its lock: its lock is then on a file no path names. It must not count, or a
    third recording, creating the file anew, would hold the same output at once."""
    out = str(tmp_path / "run.pftrace")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, out], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        opened = []
        real_open = os.open

        def open_then_release(path, *args):
            fd = real_open(path, *args)
            if not opened:  # the holder removes and releases the file this one opened
                opened.append(path)
                os.kill(holder.pid, signal.SIGUSR1)
                holder.wait(timeout=60)
            return fd

        monkeypatch.setattr(os, "open", open_then_release)
        assert claim(out)
        monkeypatch.undo()
        assert len(opened) == 1
        # the claim is on the file the path names: another process is refused
        refused = subprocess.run([sys.executable, "-c", TRY, out], capture_output=True,
                                 text=True, timeout=60, check=True)
        assert refused.stdout.strip() == "refused"
    finally:
        holder.kill()
        holder.wait(timeout=60)
        holder.stdout.close()
        release()


HOLD = r'''
import signal, sys, time
from neuron_explorer.collectors.output_claim import claim, release
assert claim(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *_: (release(), sys.exit(0)))
print("held", flush=True)
time.sleep(60)
'''

TRY = r'''
import sys
from neuron_explorer.collectors.output_claim import claim
print("claimed" if claim(sys.argv[1]) else "refused")
'''
