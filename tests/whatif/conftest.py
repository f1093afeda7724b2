"""Recordings of tests/whatif/workloads.py, made once per test session (once for all
pytest-xdist workers: they share one folder, and a lock per recording)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).with_name("workloads.py")


def record(folder: Path, name: str, hardware: str, level: str = "op",
           compiled: bool = False) -> Path:
    """Record workload `name` on `hardware` (modelled host clock: reproducible)."""
    out = folder / f"{name}_{hardware}_{level}{'_compiled' if compiled else ''}.pftrace"
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be recording it now
        if not out.exists():
            partial = out.with_suffix(".partial.pftrace")
            env = {**os.environ, "NEURON_HARDWARE": hardware, "NEURON_HOST_CLOCK": "modelled"}
            cmd = [sys.executable, str(WORKLOADS), name, str(partial), level]
            subprocess.run(cmd + (["compiled"] if compiled else []), env=env, check=True,
                           timeout=300)
            partial.rename(out)  # only a whole recording is ever found by name
    return out


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.getbasetemp()
    # under pytest-xdist each worker has its own base folder in this run's folder
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "whatif"
    folder.mkdir(exist_ok=True)
    return lambda name, hardware, level="op", compiled=False: record(
        folder, name, hardware, level, compiled)
