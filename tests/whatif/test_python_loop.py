"""What the finding on a Python loop over the batch says vectorising saves, against a
recording of that fix (modelled clock). A user's loss looped over its 32 samples: 95% of
the step, and no finding named the loop (compiling, advised, saved 1%)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "per_sample_loss.py"


def test_a_loop_over_the_batch_saves_what_vectorising_it_saves(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"loop": [], "vectorised": ["--vectorised"]},
                            modelled=True)
    loop, vectorised = load(paths["loop"]), load(paths["vectorised"])
    (f,) = [f for f in loop.bottlenecks() if f.rule_id == "python_loop"]
    assert f.title.startswith("A Python loop runs 24 iterations a step (")
    body = PROGRAM.read_text().splitlines().index(
        "        logp = F.log_softmax(logits[i], dim=-1)[target[i]]") + 1
    assert f.title.endswith(f"per_sample_loss.py:{body}-{body + 1})")  # the loop's body
    assert "reads a value on the host 24 times" in f.explanation
    assert f.recommendation.startswith("Vectorise the loop at ")
    saved = float(in_analysed_steps(loop, loop.steps)["dur"].sum()
                  - in_analysed_steps(vectorised, vectorised.steps)["dur"].sum())
    assert saved > 0.5 * in_analysed_steps(loop, loop.steps)["dur"].sum()  # the premise
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
    assert not [f for f in vectorised.bottlenecks() if f.rule_id == "python_loop"]
    # the loop's reads: their finding points at the loop, not at reading less often (taking
    # the read out with gather made a user's step slower)
    (sync,) = [f for f in loop.bottlenecks() if f.rule_id == "sync_in_step"]
    assert sync.recommendation.startswith("These reads are a Python loop's (")
    assert "every N steps" not in sync.recommendation


def test_a_loop_over_positions_is_one_and_a_recurrence_is_not(tmp_path) -> None:
    """A loss summed over a sequence's positions (`logits[:, t]`) was not found: only a
    loop slicing the first dim was. A recurrence (each position reads the state the one
    before made) is a loop no whole-tensor op replaces: a user's hand-written RNN was
    claimed 4.94 ms a step that vectorising could not save."""
    paths = record_variants(tmp_path, PROGRAM, {
        "positions": ["--positions"], "whole": ["--positions", "--vectorised"],
        "recurrent": ["--recurrent"]}, modelled=True)
    positions, whole = load(paths["positions"]), load(paths["whole"])
    (f,) = [f for f in positions.bottlenecks() if f.rule_id == "python_loop"]
    assert f.title.startswith("A Python loop runs 24 iterations a step (")
    assert "Compiling the function that holds the loop unrolls it" in f.recommendation
    saved = float(in_analysed_steps(positions, positions.steps)["dur"].sum()
                  - in_analysed_steps(whole, whole.steps)["dur"].sum())
    assert f.time_lost_ns == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)
    recurrent = load(paths["recurrent"])
    assert not [f for f in recurrent.bottlenecks() if f.rule_id == "python_loop"]


def test_a_model_called_once_per_sample_is_a_loop(tmp_path) -> None:
    """The model called on one sample at a time: its layers' ops repeat in the same few
    modules every iteration (not a loop over layers), and their backward, in those
    modules' backward, repeats as often: both collapse in the replay."""
    paths = record_variants(tmp_path, PROGRAM, {
        "samples": ["--model-per-sample"], "batch": ["--model-per-sample", "--vectorised"]},
        modelled=True)
    samples, batch = load(paths["samples"]), load(paths["batch"])
    (f,) = [f for f in samples.bottlenecks() if f.rule_id == "python_loop"]
    assert f.title.startswith("A Python loop runs 24 iterations a step (")
    saved = float(in_analysed_steps(samples, samples.steps)["dur"].sum()
                  - in_analysed_steps(batch, batch.steps)["dur"].sum())
    assert f.time_lost_ns == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)


def test_a_metric_loop_after_the_optimizer_step_is_a_loop(tmp_path) -> None:
    """A per-sample accuracy count after `optimizer.step()`, over 1-D predictions
    (`pred[i] == y[i]`): it lands in the step after, so the first recorded step has none,
    and its slices are of a tensor of one dim. A user's such loop was 68% of the step,
    and no finding named it."""
    paths = record_variants(tmp_path, PROGRAM, {
        "loop": ["--accuracy"], "vectorised": ["--accuracy", "--vectorised"]}, modelled=True)
    loop, vectorised = load(paths["loop"]), load(paths["vectorised"])
    (f,) = [f for f in loop.bottlenecks() if f.rule_id == "python_loop"]
    assert f.title.startswith("A Python loop runs 24 iterations a step (")
    saved = float(in_analysed_steps(loop, loop.steps)["dur"].sum()
                  - in_analysed_steps(vectorised, vectorised.steps)["dur"].sum())
    assert saved > 0.3 * in_analysed_steps(loop, loop.steps)["dur"].sum()  # the premise
    assert f.time_lost_ns == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)
    assert not [f for f in vectorised.bottlenecks() if f.rule_id == "python_loop"]
    # the metric has no backward: the text says none (it read "with their backward")
    assert " ops a step." in f.explanation and "with their backward" not in f.explanation


def test_compiling_the_loss_is_not_claimed_for_a_loops_ops(tmp_path) -> None:
    """A compiled model and an accuracy loop over the batch after its optimizer step:
    host_bound replayed every eager launch inside the graphs, the loop's too, and claimed
    3.3 ms a step for compiling the loss; a trial's like claim, 3.7 ms, saved 4.5 us (a
    loop that reads its samples on the host breaks a graph). The loop is python_loop's:
    host_bound claims no more for the looped run than for the vectorised one."""
    paths = record_variants(tmp_path, PROGRAM,
                            {"loop": ["--accuracy", "--compile"],
                             "vectorised": ["--accuracy", "--compile", "--vectorised"]},
                            modelled=True)
    loop, vectorised = load(paths["loop"]), load(paths["vectorised"])
    claims = {name: sum(f.time_lost_ns for f in t.bottlenecks() if f.rule_id == "host_bound")
              for name, t in (("loop", loop), ("vectorised", vectorised))}
    assert 0 < claims["loop"] <= claims["vectorised"], claims
    assert [f for f in loop.bottlenecks() if f.rule_id == "python_loop"]


def test_a_library_calls_views_per_tensor_are_no_loop(tmp_path) -> None:
    """`clip_grad_norm_` over 18 parameters makes a view of each (`as_strided`, no kernel) at
    the user's line: python_loop called it a loop of 18 iterations to vectorise, which no
    user can (a trial's GPT: 29 iterations, 348 us a step claimed, foreach=True saved 0)."""
    from neuron_explorer.rules.python_loop import loop_lines

    mlp = Path(__file__).parent / "programs" / "small_mlp.py"
    trace = load(record_variants(tmp_path, mlp, {"clip": ["9", "--clip"]}, modelled=True)["clip"])
    ops = trace.ops[trace.ops["step"] == 3]
    line = ops[ops["name"].astype(str) == "aten::_foreach_norm"]["source"].iloc[0]
    assert (ops["source"] == line).sum() >= 16  # the premise: many ops at the clip's line
    assert loop_lines(trace)[0] == []
    assert not [f for f in trace.bottlenecks() if f.rule_id == "python_loop"]
