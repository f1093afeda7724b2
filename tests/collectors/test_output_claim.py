"""The claim on a recording's output is the recording process's own: a forked child
(a DataLoader worker) does not hold it after the recording process is gone."""

from __future__ import annotations

import subprocess
import sys
import time

from neuron_explorer.collectors.output_claim import claim

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
