"""`neuron-explorer ARGS` in a fresh process, as a user runs it: the tests that record
examples and read their reports through the command line share this one runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "neuron_explorer.cli"]


def run_cli(*args: str, cwd: Path, modelled: bool = False, env: dict | None = None,
            timeout: float = 300) -> str:
    """Run the command (no recording of this process inherited; `modelled`: the modelled
    host clock, the same times every run, whatever shares the machine); fail the test
    with its stderr unless it succeeds; return its stdout."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    env.pop("NEURON_EXPLORER_RECORD", None)
    if modelled:
        env["NEURON_HOST_CLOCK"] = "modelled"
    proc = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
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
