"""A mixture-of-experts layer picks each expert's tokens with `nonzero`, whose output's size
depends on the data: Dynamo breaks the graph there unless
`torch._dynamo.config.capture_dynamic_output_shape_ops = True`, and a break inside the
experts' loop runs the whole forward eagerly. The host-bound finding claimed what compiling
saves with that setting (14.8 ms a step in a trial, where compiling as told saved 0.3 ms)
and never named it. All on the modelled clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.rules.finding import step_time

pytestmark = pytest.mark.slow  # three recordings
PROGRAM = Path(__file__).parent / "programs" / "routed_experts.py"


def _per_step(trace) -> float:
    return step_time(trace) / len(in_analysed_steps(trace, trace.steps))


def test_compiling_a_router_that_picks_with_nonzero_names_the_setting_it_needs(
        tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {
        "eager": [], "compiled": ["--compile"],
        "captured": ["--compile", "--capture-dynamic"]}, modelled=True)
    eager, compiled, captured = (load(paths[n]) for n in ("eager", "compiled", "captured"))
    (f,) = [f for f in eager.bottlenecks() if f.rule_id == "host_bound"]
    assert "capture_dynamic_output_shape_ops = True" in f.recommendation
    assert "`aten::nonzero` (" in f.recommendation
    assert "a break inside a loop runs the whole forward eagerly" in f.recommendation
    # a branch on the size breaks it even so (a trial's router saved 2% until it was gone)
    assert "if idx.numel() == 0: continue" in f.recommendation
    claimed = f.time_lost_ns / len(in_analysed_steps(eager, eager.steps))
    # with the setting, compiling saves the claim; without it, next to nothing
    assert claimed == pytest.approx(_per_step(eager) - _per_step(captured), rel=0.1)
    assert _per_step(eager) - _per_step(compiled) < 0.1 * claimed
