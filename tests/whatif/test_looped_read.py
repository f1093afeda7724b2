"""A forward that reads a device value in a loop (an early exit's `.item()` per block):
Dynamo runs such a frame eagerly, and the compiled what-if replay, which broke the graph
at each read and compiled the blocks between, predicted 2.9x where compiling changed
nothing (a user's early-exit MLP). Modelled host clock: both runs exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.rules.finding import step_time
from neuron_explorer.what_if.compiled import looped_reads
from neuron_explorer.what_if.replay import predicted_step_ns

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "early_exit.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    paths = record_variants(tmp_path_factory.mktemp("early_exit"), PROGRAM, {
        "eager": [], "compiled": ["--compile"], "no-exit": ["--no-exit"],
        "compiled-no-exit": ["--compile", "--no-exit"]}, modelled=True)
    return {name: load(path) for name, path in paths.items()}


def test_a_read_in_a_loop_keeps_the_forward_eager_in_the_compiled_prediction(runs) -> None:
    eager, compiled = runs["eager"], runs["compiled"]
    (line,) = looped_reads(eager).values()
    assert list(looped_reads(eager)) == ["model"] and line.endswith("early_exit.py:27")
    measured = float(in_analysed_steps(compiled, compiled.steps)["dur"].median())
    predicted = predicted_step_ns(eager, "compiled")
    assert predicted == pytest.approx(measured, rel=0.1), (predicted, measured)
    (host,) = [f for f in eager.bottlenecks() if f.rule_id == "host_bound"]
    assert f"inside a loop (`model` at {line})" in host.recommendation
    assert "the forward would run eagerly" in host.explanation


def test_the_reads_saving_takes_what_the_forward_made_for_them(runs) -> None:
    """A read inside a module's forward is its control flow: removing it takes the ops its
    line made for it (the norm), where only the read was replayed (half of what going
    without the early exit saved, on a user's MLP)."""
    eager, plain = runs["eager"], runs["no-exit"]
    (f,) = [f for f in eager.bottlenecks() if f.rule_id == "sync_in_step"]
    saved = step_time(eager) - step_time(plain)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)
    # the reads are the forward's control flow: not "read results every N steps" (a
    # user's per-layer `if h.std() > 2.0` was told to read its results after the loop)
    assert f.recommendation.startswith("The reads at "), f.recommendation
    assert "inside the model's forward" in f.recommendation and "torch.where" in \
        f.recommendation and "every N steps" not in f.recommendation


def test_the_breaks_saving_is_the_forward_compiled_without_the_read(runs) -> None:
    """The graph break of that read: Dynamo ran the forward wholly eager, so no graphs
    were there to merge and the break was claimed nothing, where a user's branch made
    torch.where saved 84% of the step. Its saving is the run replayed compiled with the
    read gone, against the same script compiled without it."""
    from neuron_explorer.rules.graph_break_cost import READS_GONE_BASIS

    compiled, whole = runs["compiled"], runs["compiled-no-exit"]
    (f,) = [f for f in compiled.bottlenecks() if f.rule_id == "recompilation"]
    assert "a read of a device value inside a loop" in f.explanation
    assert READS_GONE_BASIS in f.saving_basis
    steps = in_analysed_steps(compiled, compiled.steps)
    saved = (float(steps["dur"].median())
             - float(in_analysed_steps(whole, whole.steps)["dur"].median())) * len(steps)
    assert saved > 0.3 * float(steps["dur"].sum())  # the premise
    # (the host's wait after each read split the replayed forward into a graph per block:
    # 1.40x under a user's fix; the forward one graph now)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)
