"""Fixtures for the collector tests: run `neuron-explorer record` on the test programs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_command

PROGRAMS = Path(__file__).parent / "programs"
CLI = [sys.executable, "-m", "neuron_explorer.cli", "record"]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NEURON_EXPLORER_RECORD", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    """A working folder holding copies of the test programs."""
    for src in PROGRAMS.glob("*.py"):
        shutil.copy(src, tmp_path / src.name)
    return tmp_path


@pytest.fixture
def record_cli(programs: Path):
    """Run `neuron-explorer record ARGS` in the programs folder; return the CompletedProcess.
    It runs forked from a record server (cli_runner.py: where a fresh process is once
    it has imported torch, without those seconds), or with `fresh` in a fresh process:
    for what happens before torch loads."""

    def run(*args: str, timeout: float = 120, fresh: bool = False
            ) -> subprocess.CompletedProcess:
        if fresh:
            return subprocess.run([*CLI, *args], cwd=programs, capture_output=True,
                                  text=True, env=cli_env(), timeout=timeout, check=False)
        return run_command("record", *args, cwd=programs, env=cli_env(), timeout=timeout)

    return run
