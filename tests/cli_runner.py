"""`neuron-explorer ARGS` as a user runs it: the tests that record examples and read their
reports through the command line share this one runner.

A `record` runs in a process forked from a server that has made a recording's imports
already (cli_server.py: torch and the backend, 2-3 s of CPU a recording), where the
process would be after them; any other command, and a `record` whose environment differs
from the server's in more than the host clock and the hardware preset, in a fresh one."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = [sys.executable, "-m", "neuron_explorer.cli"]
SERVER = Path(__file__).with_name("cli_server.py")
# May differ from the server's environment: read as a recording starts, or never (pytest
# names the test running in each)
RUNTIME_ENV = ("NEURON_HOST_CLOCK", "NEURON_HARDWARE", "PYTEST_CURRENT_TEST")


class RecordServer:
    """record_server.py, started on the first `record` asked for (one per test process)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    def serves(self, env: dict[str, str]) -> bool:
        return self.proc is None or _static(env) == self.env

    def run(self, args: tuple[str, ...], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        if self.proc is None:
            self.env = _static(env)
            self.proc = subprocess.Popen([sys.executable, str(SERVER)], env=self.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
            atexit.register(self.close)
        assert self.proc.stdin is not None and self.proc.stdout is not None
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
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()  # the server's loop ends, and it with it
            self.proc.wait(timeout=60)
            self.proc = None


def _static(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in RUNTIME_ENV}


_server = RecordServer()


def run_command(*args: str, cwd: Path, env: dict[str, str],
                timeout: float = 300) -> subprocess.CompletedProcess:
    """`neuron-explorer ARGS` in `cwd` with the environment `env`, its output captured: a
    `record` in a process forked from the record server, where its environment allows."""
    if args[:1] == ("record",) and _server.serves(env):
        return _server.run(args, cwd, env, timeout)
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


def record_variants(folder: Path, program: Path,
                    variants: dict[str, list[str]]) -> dict[str, Path]:
    """`neuron-explorer record -- python PROGRAM ARGS` once per variant (name -> ARGS), each
    into `folder/<name>.pftrace`: a script as it is and with a fix applied, for instance."""
    paths = {}
    for name, args in variants.items():
        path = folder / f"{name}.pftrace"
        run_cli("record", "-o", str(path), "--", "python", str(program), *args, cwd=folder)
        paths[name] = path
    return paths
