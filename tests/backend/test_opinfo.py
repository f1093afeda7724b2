"""PyTorch's OpInfo samples for every op, on `neuron` against the CPU, in child processes.

`opinfo_child.py` runs the ops one after another and reports each; when a child dies
(a segmentation fault, an abort) or hangs, the op it was running is recorded as a
crash and a new child carries on after it. No crash is allowed, and the ops that fail
must be exactly those listed in `opinfo_known_failures.toml`, each with its reason: a
listed op that passes fails the test too, so the list cannot go stale.

The default test compares the first samples of each op (about a minute on two cores);
the `slow` one compares every sample.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CHILD = HERE / "opinfo_child.py"
KNOWN_FAILURES = HERE / "opinfo_known_failures.toml"
OP_TIMEOUT_S = 120.0  # one op's samples; past this the child counts as hung
SAMPLES_PER_OP = 2


@dataclass
class OpInfoRun:
    """What the children reported: per op (status, reason), and the ops that crashed."""

    results: dict[str, tuple[str, str]] = field(default_factory=dict)
    crashes: dict[str, str] = field(default_factory=dict)

    def failing(self) -> dict[str, str]:
        return {op: reason for op, (status, reason) in self.results.items() if status == "fail"}


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NEURON_HARDWARE", None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _read_child(proc: subprocess.Popen, run: OpInfoRun) -> str | None:
    """Read one child's reports until it exits; the op it was in if it died or hung."""
    current = None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + OP_TIMEOUT_S
    while True:
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            proc.kill()
            proc.wait()
            run.crashes[current or "(start-up)"] = f"no result within {OP_TIMEOUT_S:.0f} s"
            return current or ""
        line = proc.stdout.readline()
        if not line:
            break
        report = json.loads(line)
        if "start" in report:
            current = report["start"]
            deadline = time.monotonic() + OP_TIMEOUT_S
        else:
            run.results[report["op"]] = (report["status"], report["reason"])
            current = None
    stderr = proc.stderr.read()
    if proc.wait() == 0:
        return None
    if current is None:
        raise RuntimeError(f"the OpInfo child failed outside any op: {stderr[-2000:]}")
    # faulthandler's "most recent call first" stack says where it died.
    lines = stderr.strip().splitlines()
    where = [line.strip() for line in lines if line.startswith("  File ")][:3] or lines[-3:]
    run.crashes[current] = f"exit status {proc.returncode}: {' | '.join(where)}"[:500]
    return current


def run_opinfo(samples_per_op: int, ops: tuple[str, ...] = ()) -> OpInfoRun:
    """Run the OpInfo samples of `ops` (all ops when empty) in children; collect reports."""
    run = OpInfoRun()
    after: list[str] = []
    while True:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", str(CHILD), str(samples_per_op), *after,
             *ops],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(),
        )
        try:
            crashed_in = _read_child(proc, run)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        if crashed_in is None:
            return run
        after = ["--after", crashed_in]


def known_failures(table: str) -> dict[str, str]:
    """The listed failures of one table of `opinfo_known_failures.toml` (op -> reason)."""
    with KNOWN_FAILURES.open("rb") as f:
        return tomllib.load(f)[table]


def _check(run: OpInfoRun, expected: dict[str, str]) -> None:
    failing = run.failing()
    problems = []
    if run.crashes:
        problems.append(f"ops that killed or hung the process: {run.crashes}")
    unlisted = {op: r for op, r in failing.items() if op not in expected}
    if unlisted:
        problems.append(f"ops failing that {KNOWN_FAILURES.name} does not list: {unlisted}")
    fixed = sorted(op for op in expected if run.results.get(op, ("", ""))[0] == "pass")
    if fixed:
        problems.append(f"listed ops that now pass (remove them from {KNOWN_FAILURES.name}): "
                        f"{fixed}")
    missing = sorted(op for op in expected if op not in run.results and op not in run.crashes)
    if missing:
        problems.append(f"listed ops that did not run (renamed or gone?): {missing}")
    assert not problems, "\n".join(problems)


def test_the_child_reports_a_crash_and_carries_on(tmp_path):
    """The harness itself: a child killed inside an op is a crash, and the run goes on."""
    run = OpInfoRun()
    script = ("import json, os, signal\n"
              "print(json.dumps({'start': 'a'}), flush=True)\n"
              "print(json.dumps({'op': 'a', 'status': 'pass', 'reason': ''}), flush=True)\n"
              "print(json.dumps({'start': 'b'}), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGSEGV)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert _read_child(proc, run) == "b"
    assert run.results == {"a": ("pass", "")}
    assert "b" in run.crashes and str(-11) in run.crashes["b"]


def test_opinfo_samples_match_the_cpu():
    _check(run_opinfo(SAMPLES_PER_OP), known_failures("sampled"))


@pytest.mark.slow
def test_opinfo_every_sample_matches_the_cpu():
    expected = known_failures("sampled") | known_failures("every_sample")
    _check(run_opinfo(0), expected)
