"""A device fix on a host-bound run whose host has nothing left to fix. The model and its
loss are compiled and Adam is fused: the host-bound finding's only advice is a larger
batch, a change of workload, so no device fix can wait on it. Casting to bfloat16 was
claimed "after the host-bound fix" as the device time it saves (a trial's compiled
recommender: 92 us a step claimed, its step unchanged); it now claims what the run
replayed cast whole saves at this batch. Modelled host clock: exact every run."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.rules import host_bound

pytestmark = pytest.mark.slow  # two recordings
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


def test_a_device_fix_claims_what_it_saves_now_where_only_a_larger_batch_is_left(
        tmp_path) -> None:
    base = ["2", "--compile", "--compile-loss", "--width", "512", "--batch", "64",
            "--optimizer", "adam-fused"]
    paths = record_variants(tmp_path, PROGRAM, {"fp32": base, "bf16": [*base, "--bf16"]},
                            modelled=True)
    trace, cast = load(paths["fp32"]), load(paths["bf16"])
    assert host_bound.is_host_bound(trace) and host_bound.only_a_larger_batch(trace)
    # the premise: the cast saves device time and no step time
    device = [float(in_analysed_steps(t, t.kernels)["dur"].sum()) for t in (trace, cast)]
    assert device[1] < 0.85 * device[0]
    assert median_step(cast) == median_step(trace)
    (fp32,) = [f for f in trace.bottlenecks() if f.rule_id == "fp32_matmul"]
    assert fp32.after == "" and "after you fix the host-bound issue" not in fp32.explanation
    assert fp32.time_lost_ns == 0  # replayed cast whole (was 8.98 us a step)
    assert "only advice left is a larger batch" in fp32.explanation
