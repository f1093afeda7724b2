"""What host_bound says bringing a compiled run's eager launches into its graphs saves,
against a recording of the same script with the loss compiled with the model and the
optimizer fused=True (modelled host clock: both runs exact)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import Trace, load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.rules.finding import Finding, step_time
from neuron_explorer.rules.host_bound import INTO_GRAPHS

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


def test_host_bound_on_a_compiled_run_claims_what_its_fix_saves(tmp_path) -> None:
    """A compiled model with an eager loss, a foreach Adam and gradient accumulation over
    4 micro-batches: the finding claimed the launch gaps, 1.32x what compiling the loss and
    fusing the optimizer saved. The replay moves the loss's launches into the graphs and
    fuses the optimizer; the backward's accumulating adds stay eager (neither fix moves
    them) and the advice names them apart."""
    base = ["2", "--compile", "--width", "256", "--accumulate", "4"]
    paths = record_variants(tmp_path, PROGRAM, {
        "eager-loss": [*base, "--optimizer", "adam"],
        "compiled-loss": [*base, "--optimizer", "adam-fused", "--compile-loss"]}, modelled=True)
    before, after = load(paths["eager-loss"]), load(paths["compiled-loss"])
    (f,) = [f for f in before.bottlenecks() if f.rule_id == "host_bound"]
    assert f.saving_basis.startswith(INTO_GRAPHS) and "fused=True" in f.saving_basis
    saved = step_time(before) - step_time(after)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.12), (f.time_lost_ns, saved)
    assert "Left eager by both: 12 adds a step at " in f.recommendation
    assert "Compute the loss inside the compiled function" in f.recommendation
    # the sequences fused, part of that saving: not the accumulating adds' windows, which
    # no fix fuses (1.41x what the fixes saved when they were counted)
    (seq,) = [f for f in before.bottlenecks() if f.rule_id == "short_kernel_sequence"]
    assert seq.time_lost_ns == pytest.approx(saved, rel=0.15), (seq.time_lost_ns, saved)


def test_a_loss_after_a_graph_break_is_compiled_into_graphs_of_its_own(tmp_path) -> None:
    """A compiled CNN whose forward checks for NaN (a graph break every call): compiled
    with the model, its loss is a graph of its own, and its backward one more, each a
    launch; the gradient `backward()` starts from stays eager. Replayed as joining the
    model's graphs, the finding claimed 1.68x what compiling the loss and fusing the
    optimizer saved (the helper's trial: 2.16x on a larger CNN)."""
    _guarded_cnn_claim(tmp_path, [])


def _guarded_cnn_claim(tmp_path, extra: list[str]) -> Finding:
    """guarded_cnn.py's host_bound finding, checked against its recorded fix."""
    program = Path(__file__).parent / "programs" / "guarded_cnn.py"
    paths = record_variants(tmp_path, program, {"eager-loss": extra,
                                                "fixed": ["--fixed", *extra]}, modelled=True)
    before, after = load(paths["eager-loss"]), load(paths["fixed"])
    (f,) = [f for f in before.bottlenecks() if f.rule_id == "host_bound"]
    assert f.saving_basis.startswith(INTO_GRAPHS)
    saved = before.summary()["total_ns"] - after.summary()["total_ns"]
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
    return f


def test_a_batch_drawn_on_the_device_stays_where_it_is(tmp_path) -> None:
    """Each step draws its batch on the device (torch.randn, torch.randint) before the
    compiled model runs: compiling the loss and fusing the optimizer leaves those draws
    eager. Counted as moved into the graphs, a trial's finding claimed 1.43x what the fix
    saved, and its advice named the draws' lines."""
    f = _guarded_cnn_claim(tmp_path, ["--drawn"])
    assert "guarded_cnn.py:45" not in f.recommendation  # the draws' lines
    assert "guarded_cnn.py:46" not in f.recommendation



def test_compiling_the_training_step_is_stated_beside_compiling_the_model(tmp_path) -> None:
    """A loss of many small ops beside the model: compiling the model saves part of the
    launches, compiling the training step (the loss with it) the rest. A trial's finding
    stated the model's saving only, and compiling its loss too saved 2.9x that."""
    from neuron_explorer.rules.host_bound import compiled_saving_ns

    program = Path(__file__).parent / "programs" / "many_op_loss.py"
    paths = record_variants(tmp_path, program, {
        "eager": [], "model": ["--compile", "model"], "step": ["--compile", "step"]},
        modelled=True)
    eager, model, step = (load(paths[name]) for name in ("eager", "model", "step"))
    (f,) = [f for f in eager.bottlenecks() if f.rule_id == "host_bound"]
    steps = len(in_analysed_steps(eager, eager.steps))
    for compiled, claimed in ((model, f.time_lost_ns),
                              (step, compiled_saving_ns(eager, whole_step=True))):
        saved = median_step(eager) - median_step(compiled)
        assert claimed / steps == pytest.approx(saved, rel=0.1), (claimed / steps, saved)
    assert "Compiling the training step instead" in f.explanation


def test_eager_ops_beside_the_graphs_of_a_device_paced_run_claim_their_fused_saving(
        tmp_path) -> None:
    """A compiled MLP whose loss runs eagerly, on a run its device paces (its host needs a
    third of the device's time): the loss's kernels took 297 us of device time a step;
    compiled with the model, 103 us. No finding said so: host_bound waits for a host-bound
    run, and its replay kept the ops' device time as it ran. The ops that join each graph
    are one program fused along their recorded data flow, run after it: at most what
    compiling the loss saves (a bound: inside the graph, some of it overlaps)."""
    base = ["2", "--compile", "--width", "1024", "--batch", "2048"]
    paths = record_variants(tmp_path, PROGRAM, {"eager-loss": base,
                                                "compiled-loss": [*base, "--compile-loss"]},
                            modelled=True)
    before, after = load(paths["eager-loss"]), load(paths["compiled-loss"])
    assert before.summary()["device_paces"]
    assert not [f for f in before.bottlenecks() if f.rule_id == "host_bound"]
    (f,) = [f for f in before.bottlenecks() if f.rule_id == "eager_beside_graphs"]
    saved = step_time(before) - step_time(after)
    assert 0.75 * saved <= f.time_lost_ns <= 1.02 * saved, (f.time_lost_ns, saved)
    assert "Compute the loss inside the compiled function" in f.recommendation
    assert not [f for f in after.bottlenecks() if f.rule_id == "eager_beside_graphs"]


def test_metrics_beside_a_compiled_loss_claim_the_zero_gradient_their_fix_removes(
        tmp_path) -> None:
    """A compiled model and loss returning its logits with their gradient tracked, for
    metrics computed eagerly on them: AOTAutograd fills in a zero gradient for those logits
    each backward (an eager `zero_`), and the backward graph reads it. The finding claimed
    0.57x what computing the metrics inside the compiled function (returned detached)
    saved: its replay moved the fill into the graphs instead of leaving it out."""
    f, after = _device_paced_claim(tmp_path, "compiled_metrics.py", ["--inside"])
    assert "return them detached" in f.recommendation
    assert "work on the model's outputs" in f.explanation
    assert not [f for f in after.bottlenecks() if f.rule_id == "eager_beside_graphs"]


def test_a_losss_backward_joins_the_backward_graph_as_a_program_of_its_own(tmp_path) -> None:
    """An eager regression loss (squared plus absolute error) beside a compiled model: its
    forward and backward ops were replayed as one fused program after the forward graph,
    keeping what the backward reads of the forward on chip, and the finding claimed 1.27x
    what compiling the loss saved. Compiled, AOTAutograd splits the loss between the
    forward and backward graphs, and those tensors go through HBM."""
    _device_paced_claim(tmp_path, "regression_loss.py", ["--compile-loss"])


def _device_paced_claim(tmp_path, program: str, fix: list[str]) -> tuple[Finding, Trace]:
    """A program's device-paced run and its fixed run (`fix`): the eager_beside_graphs
    finding of the first, which claims 0.85-1.05x the step time the fix saved; returns it
    and the fixed run."""
    paths = record_variants(tmp_path, Path(__file__).parent / "programs" / program,
                            {"eager": [], "fixed": fix}, modelled=True)
    before, after = load(paths["eager"]), load(paths["fixed"])
    assert before.summary()["device_paces"]
    (f,) = [f for f in before.bottlenecks() if f.rule_id == "eager_beside_graphs"]
    saved = step_time(before) - step_time(after)
    assert 0.85 * saved <= f.time_lost_ns <= 1.05 * saved, (f.time_lost_ns, saved)
    return f, after


def test_a_device_paced_cnns_eager_clipping_and_sgd_save_what_compiling_them_does(
        tmp_path) -> None:
    """A compiled CNN the device paces, its loss, `clip_grad_norm_` and SGD step eager:
    compiled (the model with its loss, the clipping with the step), its foreach ops run per
    parameter, each update one pass over the parameter's memory. The compile path kept each
    foreach op a kernel of its own and loaded the whole list for every write-back: the
    compiled step ran slower than its eager foreach kernels, and the replay's claim for
    the loss and the clipping (24.7 us a step) stood where compiling saved 11 us for
    everything. Now the replay fuses each foreach op per tensor as the compile path does."""
    from neuron_explorer.what_if.into_graphs import into_graphs_saving

    program = Path(__file__).parent / "programs" / "compiled_cnn_clip.py"
    paths = record_variants(tmp_path, program, {"eager": [], "split": ["--split"]},
                            modelled=True)
    before, after = load(paths["eager"]), load(paths["split"])
    steps = len(in_analysed_steps(before, before.steps))
    per_step = step_time(before) / steps
    saved = per_step - step_time(after) / len(in_analysed_steps(after, after.steps))
    assert saved > 0.02 * per_step  # the premise: compiling them pays
    into = into_graphs_saving(before, optimizer=True)
    assert into.saving_ns / steps == pytest.approx(saved, rel=0.1), (into.saving_ns / steps,
                                                                       saved)

