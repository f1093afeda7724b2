"""`whatif --mode compiled` of a step that accumulates gradients over micro-batches,
against the compiled recording of the same script (modelled clock: both the same every
run). A user's four micro-batches a step were predicted 3.51 ms compiled where compiling
ran 4.63: every op after the step's first optimizer call was taken for the backward (the
step began with the last one's `loss.item()`, then zero_grad), and the gradients'
accumulation into `.grad` (AccumulateGrad's in-place adds, which autograd runs eagerly
after the compiled backward) was fused into the graphs."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"
ARGS = ["2", "--accumulate", "4", "--optimizer", "adamw", "--item"]


def test_micro_batches_compile_into_a_forward_and_a_backward_each(tmp_path) -> None:
    from neuron_explorer.what_if.replay import predicted_step_ns

    paths = record_variants(tmp_path, PROGRAM, {"eager": ARGS, "compiled": [*ARGS, "--compile"]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    graphs = compiled.ops[compiled.ops["graph_id"] >= 0]
    steps = in_analysed_steps(compiled, compiled.steps)
    assert len(graphs[graphs["step"] == steps["step"].iloc[0]]) == 8  # the premise
    adds = compiled.ops[(compiled.ops["name"] == "aten::add_")
                        & (compiled.ops["step"] == steps["step"].iloc[0])]
    assert len(adds) == 3 * 4  # three micro-batches accumulate into four .grad, eagerly
    measured = float(steps["dur"].median())
    assert predicted_step_ns(eager) == pytest.approx(measured, rel=0.03)


def test_accumulation_beside_a_compiled_loss_is_told_compiled_autograd(tmp_path) -> None:
    """The model and its loss compiled as one function: no backward range holds autograd's
    adds into `.grad` at `backward()`, which host_bound's replay brings into the graphs. A
    trial's were told to compute the loss inside the compiled function (done already);
    compiled autograd and fused=True saved what the finding claims."""
    args = ["4", "--accumulate", "4", "--compile", "--compile-loss"]
    paths = record_variants(tmp_path, PROGRAM, {
        "eager_adds": [*args, "--optimizer", "adamw"],
        "fixed": [*args, "--optimizer", "adamw-fused", "--compiled-autograd"]}, modelled=True)
    adds, fixed = load(paths["eager_adds"]), load(paths["fixed"])
    (f,) = [f for f in adds.bottlenecks() if f.rule_id == "host_bound"]
    assert "Compute the loss inside" not in f.recommendation
    assert "The loss is compiled already" in f.recommendation
    assert "compiled_autograd._enable(" in f.recommendation
    assert "(gradient accumulation, or gradients zeroed in place), counted in the saving" \
        in f.recommendation
    saved = (in_analysed_steps(adds, adds.steps)["dur"].sum()
             - in_analysed_steps(fixed, fixed.steps)["dur"].sum())
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)
