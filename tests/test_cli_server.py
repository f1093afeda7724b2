"""The command servers (cli_server.py, through cli_runner.py) run a command as a fresh
process does: the tests that run commands through them would otherwise test something
else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import cli_runner
import pytest
from cli_runner import CLI, run_command

PROGRAM = Path(__file__).parent / "collectors" / "programs" / "train_small.py"


@pytest.mark.slow  # 10-14 s in a CI run
def test_a_forked_recording_is_a_fresh_processs_byte_for_byte(tmp_path) -> None:
    """The same modelled recording (a program that fails at its second step: its exit
    status and traceback too) in a fresh process and forked from the server: the same
    trace bytes, output and exit status."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", NEURON_HOST_CLOCK="modelled")
    env.pop("NEURON_EXPLORER_RECORD", None)
    args = ("record", "--level", "op", "-o", "t.pftrace", "--", "python", "train_small.py",
            "3", "raise")
    done = {}
    for name in ("fresh", "forked"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(PROGRAM, folder)
        if name == "fresh":
            done[name] = subprocess.run([*CLI, *args], cwd=folder, capture_output=True,
                                        text=True, env=env, timeout=300, check=False)
        else:
            done[name] = run_command(*args, cwd=folder, env=env)
    fresh, forked = done["fresh"], done["forked"]
    assert fresh.returncode == 1 and "ValueError: boom at step 2" in fresh.stderr
    # the losses are the unseeded program's own random numbers, in any process
    assert (forked.returncode, _unseeded(forked.stdout), forked.stderr) == \
        (fresh.returncode, _unseeded(fresh.stdout), fresh.stderr)
    trace = (tmp_path / "fresh" / "t.pftrace").read_bytes()
    assert len(trace) > 1000 and (tmp_path / "forked" / "t.pftrace").read_bytes() == trace


def _unseeded(stdout: str) -> str:
    return re.sub(r"loss \S+", "loss ?", stdout)


def test_a_forked_diff_is_a_fresh_processs(repo_root) -> None:
    """`diff` (two loads, the analyses and findings of each, a report) forked from its
    server prints what a fresh process prints."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    args = ("diff", "near_memory.pftrace", "odd_dims.pftrace")
    samples = repo_root / "sample_traces"
    fresh = subprocess.run([*CLI, *args], cwd=samples, capture_output=True, text=True,
                           env=env, timeout=300, check=False)
    forked = run_command(*args, cwd=samples, env=env)
    assert fresh.returncode == 0 and len(fresh.stdout) > 500, fresh.stderr
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (fresh.returncode, fresh.stdout, fresh.stderr)


def test_each_import_time_environment_has_its_server_and_the_usual_one_is_kept(
        monkeypatch) -> None:
    """A test that runs a command with a variable read on import (OMP_WAIT_POLICY) gets
    a server of its own; the tests after it, in the usual environment, find the usual
    server still there (once, the first environment's server was the only one, and every
    later recording of that worker ran in a fresh process). Variables read as the command
    runs share a server. No server process starts until a command runs."""
    monkeypatch.setattr(cli_runner, "_servers", {})
    usual = dict(os.environ, PYTHONUNBUFFERED="1")
    first = cli_runner._server("report", usual)
    assert cli_runner._server("report", dict(usual, NEURON_HOST_CLOCK="modelled")) is first
    odd = cli_runner._server("report", dict(usual, OMP_WAIT_POLICY="ACTIVE"))
    assert odd is not first
    assert cli_runner._server("report", usual) is first
    assert cli_runner._server("record", usual) is not first  # a server per command
    # the least recently used beyond SERVERS_KEPT per command goes
    for policy in ("PASSIVE", "ACTIVE"):
        cli_runner._server("report", dict(usual, OMP_WAIT_POLICY=policy))
    assert [k[0] for k in cli_runner._servers].count("report") == cli_runner.SERVERS_KEPT
    assert first not in cli_runner._servers.values()
