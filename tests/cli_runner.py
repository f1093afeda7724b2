"""`neuron-explorer ARGS` as a user runs it: the tests that record examples and read their
reports through the command line share this one runner.

`record`, `report` and `diff` run in processes forked from a server that has made the
command's imports already (cli_server.py: torch and the backend for a recording, 2-3 s of
CPU; pandas and the analyses for a report, 0.7 s), where a fresh process would be after
them (a server for each environment, as it differs in what is read on import); any other
command in a fresh process."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CLI = [sys.executable, "-m", "neuron_explorer.cli"]
SERVER = Path(__file__).with_name("cli_server.py")
SERVED = ("record", "report", "diff")
# May differ from the server's environment: read as a recording starts, or never (pytest
# names the test running in each)
RUNTIME_ENV = ("NEURON_HOST_CLOCK", "NEURON_HARDWARE", "PYTEST_CURRENT_TEST")


class CommandServer:
    """cli_server.py for one command and one environment (what it reads on import), started
    on its first run asked for; one command at a time (a test may ask from several
    threads)."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.command = command
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def run(self, args: tuple[str, ...], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        """The command run in a child of the server, with `env` (which may differ from the
        server's in what the command reads as it runs)."""
        with self.lock:
            if self.proc is None:
                self.proc = subprocess.Popen([sys.executable, str(SERVER), self.command],
                                             env=self.env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)
            return self._run(args, cwd, env, timeout)

    def _run(self, args: tuple[str, ...], cwd: Path, env: dict[str, str],
             timeout: float) -> subprocess.CompletedProcess:
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = [list(args), str(Path(cwd).resolve()), env, str(out), str(err)]
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = int(self.proc.stdout.readline())
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                os.kill(pid, signal.SIGKILL)
                self.proc.stdout.readline()
                raise subprocess.TimeoutExpired([*CLI, *args], timeout,
                                                out.read_text(), err.read_text())
            code = int(self.proc.stdout.readline())
            return subprocess.CompletedProcess([*CLI, *args], code, out.read_text(),
                                               err.read_text())

    def close(self) -> None:
        with self.lock:  # after the command it runs, if any
            if self.proc is not None:
                stop_server(self.proc)
                self.proc = None


def stop_server(proc: subprocess.Popen) -> None:
    """End a server that reads requests from its stdin, one a line: its stdin closed, its
    loop ends, and it with it."""
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=60)
    if proc.stdout is not None:
        proc.stdout.close()


def _static(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in RUNTIME_ENV}


# A server per command and environment, the last few used kept: a test that changes what
# is read on import (OMP_WAIT_POLICY, say) gets its own, and the tests after it, back in
# the usual environment, find theirs still running (one server for whatever environment
# came first sent every later recording of a worker to a fresh process: 4-7 s more each).
SERVERS_KEPT = 2
_servers: dict[tuple[str, frozenset], CommandServer] = {}
_servers_lock = threading.Lock()


def _server(command: str, env: dict[str, str]) -> CommandServer:
    static = _static(env)
    key = (command, frozenset(static.items()))
    with _servers_lock:
        server = _servers.pop(key, None) or CommandServer(command, static)
        _servers[key] = server  # the most recently used last
        ours = [k for k in _servers if k[0] == command]
        for old in ours[:-SERVERS_KEPT]:
            _servers.pop(old).close()
    return server


@atexit.register
def _close_servers() -> None:
    for server in list(_servers.values()):
        server.close()


def run_command(*args: str, cwd: Path, env: dict[str, str],
                timeout: float = 300) -> subprocess.CompletedProcess:
    """`neuron-explorer ARGS` in `cwd` with the environment `env`, its output captured: a
    `record`, `report` or `diff` in a process forked from the server of its environment."""
    if args and args[0] in SERVED:
        return _server(args[0], env).run(args, cwd, env, timeout)
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def run_cli(*args: str, cwd: Path, modelled: bool = False, env: dict | None = None,
            timeout: float = 300) -> str:
    """Run the command (no recording of this process inherited; `modelled`: the modelled
    host clock, the same times every run, whatever shares the machine); fail the test
    with its stderr unless it succeeds; return its stdout."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    env.pop("NEURON_EXPLORER_RECORD", None)
    if modelled:
        env["NEURON_HOST_CLOCK"] = "modelled"
    proc = run_command(*args, cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def record_variants(folder: Path, program: Path, variants: dict[str, list[str]],
                    modelled: bool = False) -> dict[str, Path]:
    """`neuron-explorer record -- python PROGRAM ARGS` once per variant (name -> ARGS), each
    into `folder/<name>.pftrace`: a script as it is and with a fix applied, for instance
    (`modelled`: on the modelled host clock)."""
    paths = {}
    for name, args in variants.items():
        path = folder / f"{name}.pftrace"
        run_cli("record", "-o", str(path), "--", "python", str(program), *args, cwd=folder,
                modelled=modelled)
        paths[name] = path
    return paths


def median_step(trace) -> float:
    """A recording's median analysed step (the host's windows): what a finding's claimed
    saving a step is compared with, between a script and its fixed variant."""
    from neuron_explorer.analyses.steady_state import in_analysed_steps

    return float(in_analysed_steps(trace, trace.steps)["dur"].median())
