"""Recordings of tests/whatif/workloads.py, made once per test session."""

from __future__ import annotations

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
    if not out.exists():
        env = {**os.environ, "NEURON_HARDWARE": hardware, "NEURON_HOST_CLOCK": "modelled"}
        cmd = [sys.executable, str(WORKLOADS), name, str(out), level]
        subprocess.run(cmd + (["compiled"] if compiled else []), env=env, check=True,
                       timeout=300)
    return out


@pytest.fixture(scope="session")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whatif")
    return lambda name, hardware, level="op", compiled=False: record(
        folder, name, hardware, level, compiled)
