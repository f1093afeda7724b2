"""What the recompilation finding says a tensor learning rate saves a compiled training
step under an LR schedule, against a recording of that fix (modelled clock: both exact).
The scheduler changes the learning rate, a Python float, every step: the compiled
optimizer step recompiled for each value until Dynamo's limit and then ran uncompiled
while the model's graphs still ran. The finding said "the recompile is the optimizer's:
its state is made on its first step ... once, nothing to fix" and claimed nothing, where
a user's tensor learning rate saved 2.1 ms a step."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "compiled_step_lr.py"


def test_a_tensor_learning_rate_saves_what_the_recompile_storm_says(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"float": [], "tensor": ["--tensor-lr"]},
                            modelled=True)
    floats, tensor = load(paths["float"]), load(paths["tensor"])
    (f,) = [f for f in floats.bottlenecks() if f.rule_id == "recompilation"]
    assert "follow the optimizer's learning rate" in f.recommendation
    assert "lr=torch.tensor(" in f.recommendation and "nothing to fix." not in f.recommendation
    assert "none of its graphs ran" in f.explanation
    after = in_analysed_steps(floats, floats.steps)
    saved = float(after["dur"].median()
                  - in_analysed_steps(tensor, tensor.steps)["dur"].median())
    assert saved > 0.5 * float(after["dur"].median())  # the premise
    assert f.time_lost_ns / len(after) == pytest.approx(saved, rel=0.1), (
        f.time_lost_ns / len(after), saved)
    # fixed, the step's graphs are a forward, a backward and the optimizer's: the break at
    # backward() splits no forward, and merging the optimizer's graph into the forward
    # claimed 1.28 ms of nothing to fix
    (fixed,) = [f for f in tensor.bottlenecks() if f.rule_id == "recompilation"]
    assert fixed.time_lost_ns == 0, fixed.saving_basis


def test_a_one_cycle_schedule_is_told_to_stop_cycling_the_momentum(tmp_path) -> None:
    """OneCycleLR cycles Adam's `betas[0]` as well as the learning rate: with a tensor
    learning rate the storm went on, on `betas[0]`. The finding said the recompile was the
    optimizer's state, "once, nothing to fix" (a trial's step was 3.2 ms slower after the
    advised tensor learning rate alone); the fix is cycle_momentum=False."""
    paths = record_variants(tmp_path, PROGRAM, {
        "cycled": ["--tensor-lr", "--one-cycle"],
        "fixed": ["--tensor-lr", "--one-cycle", "--no-cycle-momentum"]}, modelled=True)
    cycled, fixed = load(paths["cycled"]), load(paths["fixed"])
    (f,) = [f for f in cycled.bottlenecks() if f.rule_id == "recompilation"]
    assert "cycle_momentum=False" in f.recommendation
    assert "once, nothing to fix" not in f.recommendation
    after = in_analysed_steps(cycled, cycled.steps)
    saved = float(after["dur"].median() - in_analysed_steps(fixed, fixed.steps)["dur"].median())
    assert f.time_lost_ns / len(after) == pytest.approx(saved, rel=0.1), (
        f.time_lost_ns / len(after), saved)
