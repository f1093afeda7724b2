"""Small collectives claim what merging them saves: DDP with a bucket a layer issues an
all-reduce a layer, each a host call. A run of 40 buckets a step was told "no time to
save now" (the transfers were off the critical path); one bucket saved 1.95 ms a step,
all of it the host's launches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow  # two runs of two ranks

HERE = Path(__file__).parent


def _record(folder: Path, name: str, *script_args: str):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NEURON_HOST_CLOCK": "modelled"}
    out = folder / f"{name}.run"
    done = subprocess.run(
        [sys.executable, "-m", "neuron_explorer.cli", "record", "--level", "op", "-o",
         str(out), "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         str(HERE / "train_tiny.py"), "--steps", "8", "--layers", "12", *script_args],
        cwd=folder, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return neuron_explorer.load(out)


def _step_ns(run) -> float:
    return float(run.step_time_ns())


def test_merging_small_collectives_saves_what_their_finding_says(tmp_path):
    small = _record(tmp_path, "buckets", "--bucket-cap-mb", "0.001")
    merged = _record(tmp_path, "merged")
    (f,) = [f for f in small.bottlenecks() if f.rule_id == "small_collectives"]
    assert f.saves_time and "Each is a host call too" in f.explanation
    saved = _step_ns(small) - _step_ns(merged)
    assert saved > 0.02 * _step_ns(small)  # the premise
    steps = len(in_analysed_steps(small[0], small[0].steps))
    assert f.time_lost_ns / steps == pytest.approx(saved, rel=0.2), (f.time_lost_ns, saved)
    assert not [g for g in merged.bottlenecks() if g.rule_id == "small_collectives"]
    # compiling under DDP with many small buckets needs them raised first: a user who
    # followed the compile advice with bucket_cap_mb=0.001 hit an error in Dynamo
    (host,) = [g for g in small.bottlenecks() if g.rule_id == "host_bound"]
    assert "compiling under DDP needs bucket_cap_mb raised first" in host.recommendation
    (host,) = [g for g in merged.bottlenecks() if g.rule_id == "host_bound"]
    assert "bucket_cap_mb" not in host.recommendation
