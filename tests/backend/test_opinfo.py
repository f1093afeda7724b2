"""PyTorch's OpInfo samples for every op, on `neuron` against the CPU, in child processes.

`opinfo_child.py` runs the ops one after another and reports each; when a child dies
(a segmentation fault, an abort) or hangs, the op it was running is recorded as a
crash and a new child carries on after it. No crash is allowed, and the ops that fail
must be exactly those listed in `opinfo_known_failures.toml`, each with its reason: a
listed op that passes fails the test too, so the list cannot go stale.

The default test compares the first samples of each op (10 s of CPU); the `full` one
(`pytest --full`) compares every sample (40 s). When both run, one child
(`opinfo_passes.py`) makes both passes, the first samples' before every sample's: one
start-up instead of two.
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
CHILD = HERE / "opinfo_passes.py"
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


def _read_child(proc: subprocess.Popen, runs: list[OpInfoRun]) -> tuple[int, str] | None:
    """Read one child's reports (into `runs`, by pass) until it exits; the pass and the op
    it was in if it died or hung (op "" when it hung before its first op)."""
    current: tuple[int, str] | None = None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + OP_TIMEOUT_S
    while True:
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            proc.kill()
            proc.wait()
            hung = f"no result within {OP_TIMEOUT_S:.0f} s"
            if current is None:  # no pass got further
                for run in runs:
                    run.crashes["(start-up)"] = hung
                return 0, ""
            runs[current[0]].crashes[current[1]] = hung
            return current
        line = proc.stdout.readline()
        if not line:
            break
        report = json.loads(line)
        if "start" in report:
            current = (report["pass"], report["start"])
            deadline = time.monotonic() + OP_TIMEOUT_S
        else:
            runs[report["pass"]].results[report["op"]] = (report["status"], report["reason"])
            current = None
    stderr = proc.stderr.read()
    if proc.wait() == 0:
        return None
    if current is None:
        raise RuntimeError(f"the OpInfo child failed outside any op: {stderr[-2000:]}")
    # faulthandler's "most recent call first" stack says where it died.
    lines = stderr.strip().splitlines()
    where = [line.strip() for line in lines if line.startswith("  File ")][:3] or lines[-3:]
    runs[current[0]].crashes[current[1]] = \
        f"exit status {proc.returncode}: {' | '.join(where)}"[:500]
    return current


def run_opinfo(passes: tuple[int, ...]) -> list[OpInfoRun]:
    """Run the OpInfo samples of every op in children, a pass over the ops for each
    samples-per-op of `passes` (0: every sample); collect each pass's reports."""
    runs = [OpInfoRun() for _ in passes]
    after: list[str] = []
    while True:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", str(CHILD), *map(str, passes), *after],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(),
        )
        try:
            crashed_in = _read_child(proc, runs)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        if crashed_in is None or not crashed_in[1]:
            return runs
        after = ["--after", str(crashed_in[0]), crashed_in[1]]


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
    """The harness itself: a child killed inside an op is a crash of the pass it was in,
    and the run goes on."""
    runs = [OpInfoRun(), OpInfoRun()]
    script = ("import json, os, signal\n"
              "print(json.dumps({'start': 'a', 'pass': 0}), flush=True)\n"
              "print(json.dumps({'op': 'a', 'pass': 0, 'status': 'pass', 'reason': ''}),"
              " flush=True)\n"
              "print(json.dumps({'start': 'b', 'pass': 1}), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGSEGV)\n")
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        assert _read_child(proc, runs) == (1, "b")
    assert runs[0].results == {"a": ("pass", "")} and not runs[0].crashes
    assert not runs[1].results
    assert "b" in runs[1].crashes and str(-11) in runs[1].crashes["b"]


EVERY_SAMPLE_TEST = "test_opinfo_every_sample_matches_the_cpu"
SAMPLED_TEST = "test_opinfo_samples_match_the_cpu"


@pytest.fixture(scope="module")
def opinfo_runs(request: pytest.FixtureRequest) -> dict[int, OpInfoRun]:
    """Each pass's reports by its samples per op: the first samples' for the default test,
    every sample's for the full one; one child makes the passes of the tests this
    session runs (without --full: the first samples' alone)."""
    selected = {item.name for item in request.session.items if item.path == request.path}
    passes = tuple(n for name, n in ((SAMPLED_TEST, SAMPLES_PER_OP), (EVERY_SAMPLE_TEST, 0))
                   if name in selected)
    return dict(zip(passes, run_opinfo(passes), strict=True))


# (first: with --full, the child's run is this test's setup)
@pytest.mark.slow
@pytest.mark.full
def test_opinfo_every_sample_matches_the_cpu(opinfo_runs):
    expected = known_failures("sampled") | known_failures("every_sample")
    _check(opinfo_runs[0], expected)


@pytest.mark.slow  # its fixture runs the first sample of every op in a child: 13-19 s
def test_opinfo_samples_match_the_cpu(opinfo_runs):
    _check(opinfo_runs[SAMPLES_PER_OP], known_failures("sampled"))
