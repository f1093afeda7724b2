"""A guided sampler's two passes a step (`programs/guided_sampling.py`, on the modelled
clock): one call over both saved 24% of each step and no finding named it, while the
sampler's steps, each reading the last one's result, were told to be served 8 at a time
as requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.data_flow import reads_results_of
from neuron_explorer.analyses.phases import model_calls

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "guided_sampling.py"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory):
    paths = record_variants(tmp_path_factory.mktemp("guided"), PROGRAM, {
        "plain": [], "batched": ["--batched"],
        "heun": ["--heun"], "heun_batched": ["--heun", "--batched"]}, modelled=True)
    return {name: load(path) for name, path in paths.items()}


def _joined(trace):
    return [f for f in trace.bottlenecks() if f.rule_id == "joined_calls"]


@pytest.mark.parametrize(("name", "fixed"), [("plain", "batched"), ("heun", "heun_batched")])
def test_independent_calls_in_a_step_are_claimed_what_one_call_saves(traces, name,
                                                                      fixed) -> None:
    (finding,) = _joined(traces[name])
    assert "called 2 times a step" in finding.title
    assert "torch.cat" in finding.recommendation and ".chunk(2)" in finding.recommendation
    claimed = finding.time_lost_ns / finding.steps
    saved = median_step(traces[name]) - median_step(traces[fixed])
    # the replay keeps an op a call for each input stacked and the split: 1.12x measured
    assert saved > 0 and saved <= claimed <= 1.2 * saved, (claimed, saved)
    assert not _joined(traces[fixed])


def test_a_samplers_steps_are_no_requests_to_batch(traces) -> None:
    for trace in traces.values():
        assert not [f for f in trace.bottlenecks() if f.rule_id == "unbatched_calls"]


def test_a_correctors_pass_reads_the_first_and_stays_apart(traces) -> None:
    t = traces["heun"]
    calls = model_calls(t)
    step = int(calls["step"].max())
    windows = calls[calls["step"] == step]
    assert len(windows) == 3
    ops = t.ops

    def op_ids(r) -> np.ndarray:
        return ops[(ops["ts"] >= r.ts) & (ops["ts"] < r.end)]["op_id"].to_numpy(np.int64)

    cond, uncond, corrector = (op_ids(r) for r in windows.itertuples())
    assert reads_results_of(t, cond, uncond) is False
    assert reads_results_of(t, np.concatenate([cond, uncond]), corrector) is True
