"""`neuron-explorer record -- torchrun ...`: one trace per rank in a run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import neuron_explorer
import pytest

pytestmark = pytest.mark.slow  # a launcher and two ranks that import torch

HERE = Path(__file__).parent
CLI = [sys.executable, "-m", "neuron_explorer.cli", "record"]
LAUNCH = ["--", "python", "-m", "torch.distributed.run", "--nproc_per_node=2"]


def _record(tmp_path: Path, *args: str, script_args: tuple[str, ...] = ()):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*CLI, *args, *LAUNCH, str(HERE / "train_tiny.py"), *script_args],
                          check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env=env)


def _collectives(trace) -> list[dict]:
    s = trace.slices
    rows = s[s.category == "collective"].sort_values("ts")
    return [{**a, "ts": int(ts), "end": int(ts + dur)}
            for a, ts, dur in zip(rows["args"], rows["ts"], rows["dur"], strict=True)]


def test_each_rank_writes_its_trace_into_one_run_folder(tmp_path):
    done = _record(tmp_path, "--level", "op", "--steps", "1:3")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "train_tiny.run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert manifest["preset"] == "trn2" and manifest["topology"]["ranks_per_chip"] == 8
    assert manifest["level"] == "op" and manifest["steps"] == [1, 3]
    assert [r["trace"] for r in manifest["ranks"]] == ["rank0.pftrace", "rank1.pftrace"]
    assert "rank 0:" in done.stderr and "rank 1:" in done.stderr
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json", "rank0.pftrace",
                                                     "rank1.pftrace"]
    traces = [neuron_explorer.load(run / f"rank{r}.pftrace") for r in (0, 1)]
    per_rank = [_collectives(t) for t in traces]
    assert per_rank[0] and len(per_rank[0]) == len(per_rank[1])
    for a, b in zip(*per_rank, strict=True):
        # the same call on both ranks: same seq, op, bytes, group; one end on both clocks
        for key in ("seq", "collective", "bytes", "group", "algorithm", "transfer_ns"):
            assert a[key] == b[key]
        assert a["end"] == b["end"]
        assert a["group"] == "[0, 1]"
        assert min(a["wait_ns"], b["wait_ns"]) == 0  # the later rank never waits
        assert a["end"] - a["ts"] == a["wait_ns"] + a["transfer_ns"]
    # DDP's gradient all-reduce, once per recorded step (steps 1 and 2 only), on both ranks
    for calls in per_rank:
        assert [c["step"] for c in calls if c["collective"] == "all_reduce"] == [1, 2]
    for t in traces:
        assert list(t.steps["step"]) == [1, 2]


def test_a_killed_rank_leaves_a_prefix_and_the_other_trace_is_complete(tmp_path):
    done = _record(tmp_path, "--level", "op", "-o", "out.run",
                   script_args=("--steps", "40", "--die-at", "30"))
    assert done.returncode != 0
    run = tmp_path / "out.run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["exit_code"] != 0
    survivor = neuron_explorer.load(run / "rank0.pftrace")
    assert _collectives(survivor)
    killed = run / "rank1.pftrace"
    assert killed.exists() and killed.stat().st_size > 0
    prefix = neuron_explorer.load(killed)  # what it wrote before SIGKILL reads
    assert len(prefix.slices) > 0
    assert any("no end mark" in w for w in prefix.warnings)  # and says it is cut short
    from neuron_explorer.runs.report import render_run_report

    text = render_run_report(neuron_explorer.load(run), "text")
    assert "cut short" in text and "rank 1: the recording stopped before its end" in text


def test_a_rank_that_raises_is_named_in_the_record_output_and_the_report(tmp_path):
    """A rank's crash once left a report that read as a run's ("step time 0 ns") and a
    `record` that said only where the run went."""
    done = _record(tmp_path, "--level", "op", "-o", "out.run",
                   script_args=("--steps", "3", "--raise-at", "1"))
    assert done.returncode != 0
    assert "the program exited with code 1" in done.stderr
    from neuron_explorer.runs.report import render_run_report

    text = render_run_report(neuron_explorer.load(tmp_path / "out.run"), "text")
    assert "rank 1 exited with code 1: ValueError: no data for step 1 (" in text
    assert "train_tiny.py:" in text.split("ValueError")[1]  # the line it came through
    assert "the traces hold what ran until then" in text
