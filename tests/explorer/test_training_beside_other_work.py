"""Training loops with other work in their iterations (`programs/beside_training.py`), on
the modelled clock: the per-step figures are the training steps', counted as such, and
the advice names what the user's code does. Each case was a script of a trial whose
report was empty, split its steps, or divided its findings by the wrong count."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.phases import phases
from neuron_explorer.analyses.step_breakdown import step_windows

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "beside_training.py"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory):
    paths = record_variants(tmp_path_factory.mktemp("beside_training"), PROGRAM, {
        "sample": ["sample", "--compile"],
        "distill": ["distill"], "distill_eval": ["distill", "--teacher-eval"],
        "gan": ["gan"], "gan_compiled": ["gan", "--compile"],
        "gan_compiled_step": ["gan", "--compile-step"],
        "distill_compiled_step": ["distill", "--compile-step"],
        "policy": ["policy"], "policy_fixed": ["policy", "--no-validation"],
    }, modelled=True)
    return {name: load(path) for name, path in paths.items()}


def _claims_per_step(trace) -> list[tuple[str, int]]:
    return [(f.rule_id, f.steps) for f in trace.bottlenecks() if f.steps]


def test_sampling_after_training_leaves_the_training_steps_analysed(traces) -> None:
    """`model.eval()` under no_grad recompiles in the first sampling step: the steps after
    it were analysed, all of them sampling, and the report had no step time and no
    finding. Sampling steps are not in the per-step figures, nor in their count."""
    t = traces["sample"]
    s = t.summary()
    assert s["step_time_ns"] and s["total_ns"] > 0
    training = set(phases(t).query("phase == 'train'")["step"])
    counted = step_windows(t)["step"].tolist()
    assert counted and set(counted) <= training, (counted, training)
    assert s["steps_counted"] == len(counted)
    findings = t.bottlenecks()
    assert findings
    for f in findings:
        if f.steps:
            assert f.steps == len(counted), (f.rule_id, f.steps, counted)
            assert f.time_lost_ns <= s["total_ns"] * 1.001, (f.rule_id, f.time_lost_ns)


def test_a_frozen_teachers_forward_is_part_of_the_students_step(traces) -> None:
    """The teacher, larger than the student and in eval mode under no_grad, was taken for
    the model: its forwards read as eval passes and left every step, which read 1.5x
    faster with `teacher.eval()` (diff's step time too) where it saved 10%."""
    plain, in_eval = traces["distill"], traces["distill_eval"]
    for t in (plain, in_eval):
        assert set(phases(t)["phase"]) == {"train"}
    ratio = in_eval.summary()["step_time_ns"] / plain.summary()["step_time_ns"]
    assert 0.8 < ratio < 1.0, ratio  # the teacher's dropout is all eval mode saves


def test_a_frozen_teacher_in_training_mode_is_named_with_what_eval_saves(traces) -> None:
    """The teacher's dropout ran in every step (its outputs random, 9% of the step) and no
    finding said so; the replay without it once left out each op's front end, which its
    Dropout module holds alone (0.72x of what `.eval()` saved)."""
    plain, in_eval = traces["distill"], traces["distill_eval"]
    (f,) = [f for f in plain.bottlenecks() if f.rule_id == "frozen_train_mode"]
    assert "beside_training.py:60" in f.title
    assert "dropout zeroes values at random (4 a step)" in f.explanation
    assert f.recommendation.startswith("Call .eval() on it once")
    assert not [f for f in in_eval.bottlenecks() if f.rule_id == "frozen_train_mode"]
    saved = plain.summary()["total_ns"] - in_eval.summary()["total_ns"]
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)


def test_two_optimizers_before_the_first_mark_are_one_iteration(traces) -> None:
    """A GAN marks its iterations after both optimizer steps: before the first mark its
    two `step()` calls split iteration 0 in three steps, all analysed (14 steps for 12
    iterations, a median of the wrong length)."""
    t = traces["gan"]
    iterations = 8  # the program's STEPS
    assert len(t.steps) == iterations + 2
    counted = step_windows(t)
    assert len(counted) == iterations - 1
    assert "end before the first step mark" in t.summary()["steps_analysed_text"]
    durations = counted["dur"].to_numpy()
    assert durations.min() > 0.8 * durations.max()  # whole iterations, alike


def test_a_distributions_argument_checks_are_named(traces) -> None:
    """Each `Categorical(logits=...)` and `log_prob` checks its arguments, reading a device
    value on the host: the reads were called metrics to read every N steps, at the lines
    that built the distribution. The advice is validate_args=False, and saves what the
    finding claims."""
    t, fixed = traces["policy"], traces["policy_fixed"]
    (f,) = [f for f in t.bottlenecks() if f.rule_id == "sync_in_step"]
    assert "torch.distributions' checks of their arguments (Categorical.__init__, " \
           "Categorical.log_prob)" in f.recommendation
    assert "validate_args=False" in f.recommendation
    assert not [f for f in fixed.bottlenecks() if f.rule_id == "sync_in_step"]
    saved = t.summary()["step_time_ns"] - fixed.summary()["step_time_ns"]
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)


def test_a_compiled_gans_recompiles_are_graphs_it_needs(traces) -> None:
    """The compiled generator and discriminator recompile once each: a second module through
    torch.compile's one wrapper, and the discriminator's input detached in one call and not
    in the other. They were told to keep their "guarded values" constant (or to pad their
    shapes); nothing of the script changes them, so nothing is to be saved."""
    (finding,) = [f for f in traces["gan_compiled"].bottlenecks()
                  if f.rule_id == "recompilation"]
    advice = finding.recommendation
    assert "which module the compiled call runs" in advice, advice
    assert "recompile_limit" in advice and "x.detach()" in advice, advice
    assert "guarded values" not in advice and "pad or bucket" not in advice, advice
    assert finding.time_lost_ns == 0 and finding.severity == "low"


@pytest.mark.parametrize(("plain", "fixed", "whole_step"), [
    ("gan", "gan_compiled", False), ("gan", "gan_compiled_step", True),
    ("distill", "distill_compiled_step", True)])
def test_compiling_claims_what_compiling_saves(traces, plain, fixed, whole_step) -> None:
    """host_bound's figures for compiling the models and for compiling the training step
    (models and losses in one compiled function), against the run compiled as advised: a
    trial measured 0.78x (the GAN's step) and 0.89x (the distillation's); now 1.06x, 1.10x
    and 1.03x."""
    from neuron_explorer.analyses.step_breakdown import counted_steps
    from neuron_explorer.rules.host_bound import compiled_saving_ns

    t = traces[plain]
    claimed = compiled_saving_ns(t, whole_step=whole_step) / counted_steps(t)
    saved = median_step(t) - median_step(traces[fixed])
    assert saved > 0 and claimed == pytest.approx(saved, rel=0.15), (claimed, saved)
