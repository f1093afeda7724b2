"""Recordings of tests/whatif/workloads.py, made once per test session (once for all
pytest-xdist workers: they share one folder, and a lock per recording)."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import stop_server

WORKLOADS = Path(__file__).with_name("workloads.py")


class Recorder:
    """`workloads.py serve`, started on the first recording asked for: each recording in
    a process forked from it after its imports, as a fresh process would record it (the
    same trace, byte for byte), without the 1-2 s of importing torch each time."""

    def __init__(self) -> None:
        self.server: subprocess.Popen | None = None

    def __call__(self, partial: Path, name: str, hardware: str, level: str,
                 compiled: bool) -> None:
        if self.server is None:
            env = {**os.environ, "NEURON_HOST_CLOCK": "modelled"}  # reproducible times
            self.server = subprocess.Popen([sys.executable, str(WORKLOADS), "serve"], env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True)
        assert self.server.stdin is not None and self.server.stdout is not None
        log = partial.with_suffix(".log")
        request = [hardware, name, str(partial), level, *(["compiled"] if compiled else [])]
        self.server.stdin.write(json.dumps([*request, str(log)]) + "\n")
        self.server.stdin.flush()
        if not select.select([self.server.stdout], [], [], 300)[0]:
            self.server.kill()
            self.close()
            raise TimeoutError(f"recording {request} took over 300 s")
        status = self.server.stdout.readline().strip()
        if status != "0":
            output = log.read_text() if log.exists() else ""
            raise RuntimeError(f"recording {request} failed ({status or 'no server'}):\n"
                               f"{output[-4000:]}")

    def close(self) -> None:
        if self.server is not None:
            stop_server(self.server)
            self.server = None


def record(recorder: Recorder, folder: Path, name: str, hardware: str, level: str = "op",
           compiled: bool = False) -> Path:
    """Record workload `name` on `hardware` (modelled host clock: reproducible)."""
    out = folder / f"{name}_{hardware}_{level}{'_compiled' if compiled else ''}.pftrace"
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be recording it now
        if not out.exists():
            partial = out.with_suffix(".partial.pftrace")
            recorder(partial, name, hardware, level, compiled)
            partial.rename(out)  # only a whole recording is ever found by name
    return out


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.getbasetemp()
    # under pytest-xdist each worker has its own base folder in this run's folder
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "whatif"
    folder.mkdir(exist_ok=True)
    recorder = Recorder()
    yield lambda name, hardware, level="op", compiled=False: record(
        recorder, folder, name, hardware, level, compiled)
    recorder.close()
