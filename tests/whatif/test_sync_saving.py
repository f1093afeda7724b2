"""A `.item()` every step: what the sync finding says removing it saves, against a
recording of the same script without it.

The saving is the run replayed without the syncs and the reads that make them. It was
once the device idle after each sync or the host's wait at it, whichever was less: on a
compiled MLP with Adam that said 676 us where removing the `.item()` saved 1.58 ms, the
host's dispatch of the read and its copy being left out (the host runs ahead once nothing
makes it wait). A compiled recording cannot be lowered again: it is replayed from its
recorded kernels (`what_if.kernel_retime`). The host's Python between the read and its
wait is in no slice, and goes with them. Both recordings are on the modelled host
clock, the same every run, so the two figures are compared exactly.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.rules.finding import step_time

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


@pytest.mark.parametrize("mode", [[], ["--compile"]], ids=["eager", "compiled"])
def test_the_sync_findings_saving_is_what_removing_the_item_saves(tmp_path, mode) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"item": ["2", *mode, "--item"],
                                                "fixed": ["2", *mode]}, modelled=True)
    item, fixed = load(paths["item"]), load(paths["fixed"])
    (f,) = [f for f in item.bottlenecks() if f.rule_id == "sync_in_step"]
    assert f.saving_basis.startswith("replay")
    saved = step_time(item) - step_time(fixed)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)
    assert not [f for f in fixed.bottlenecks() if f.rule_id == "sync_in_step"]


def test_removing_a_check_saves_the_ops_that_made_what_it_read(tmp_path) -> None:
    """`if not bool(torch.isfinite(out).all())` every step: removing the check removes
    the ops of its line whose results only the read took, `isfinite`'s and `all` (a
    decoder's end-of-text check was promised 62 us a step where removing it saved 136);
    the output they read stays, made on another line, as the loss read by `.item()` does
    (the backward needs what made it)."""
    paths = record_variants(tmp_path, PROGRAM, {"check": ["2", "--check-finite"],
                                                "fixed": ["2"]}, modelled=True)
    check, fixed = load(paths["check"]), load(paths["fixed"])
    (f,) = [f for f in check.bottlenecks() if f.rule_id == "sync_in_step"]
    saved = step_time(check) - step_time(fixed)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)
    assert "the ops that made what it read" in f.saving_basis


@pytest.mark.parametrize("read_as", ["every-step", "every-step-view"])
def test_predictions_read_every_step_save_what_keeping_them_on_the_device_saves(
        tmp_path, read_as: str) -> None:
    """`preds.append(out.argmax(dim=1).cpu())` every step, fixed as advised: kept on the
    device, read once after the loop. The argmax stays (the predictions are the point):
    the saving is the syncs and their copies, where it once counted the argmax too
    (1.36 ms claimed for 0.68 saved). Read through a view (`.view(-1, 1).cpu()`), the view
    is made for the read alone and goes with it (a decoder's `nxt.flatten().tolist()` was
    promised 62 us a step where reading after the loop saved 74: the recorded data flow
    links the read to the argmax, not to the view of it)."""
    paths = record_variants(tmp_path, PROGRAM, {
        "read": ["2", "--predictions", read_as],
        "kept": ["2", "--predictions", "on-device"]}, modelled=True)
    read, kept = load(paths["read"]), load(paths["kept"])
    (f,) = [f for f in read.bottlenecks() if f.rule_id == "sync_in_step"]
    saved = step_time(read) - step_time(kept)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)
    assert ("read losses and metrics (.item(), .cpu(), print) every N steps or after the "
            "loop, and keep them on the device in between") in f.recommendation
    # a host-bound eager run: the tensors kept as they are, not metrics accumulated on the
    # device (an op, a launch, per term: a user's step ran 296 us slower so)
    assert "(the tensors themselves: loss.detach(), the outputs" in f.recommendation
    assert "accumulate them into device tensors" not in f.recommendation
    # the device had finished at each read: the reads cost, and the title says so (it said
    # the host waits, beside sites that waited 0 ns)
    assert "the host waited 0 ns" in f.explanation
    assert f.title == "Host reads device values inside the step (11 reads)", f.title


def test_predictions_whose_argmax_moves_after_the_loop_save_what_the_finding_adds(
        tmp_path) -> None:
    """The same reads fixed the other way the advice allows: the outputs themselves kept,
    their argmax taken when read after the loop. The argmax goes too: the finding says
    what that saves beside its headline (a user who did so saved 180 us a step where 120
    were claimed)."""
    paths = record_variants(tmp_path, PROGRAM, {
        "read": ["2", "--predictions", "every-step"],
        "outputs": ["2", "--predictions", "outputs-kept"]}, modelled=True)
    read, outputs = load(paths["read"]), load(paths["outputs"])
    (f,) = [f for f in read.bottlenecks() if f.rule_id == "sync_in_step"]
    found = re.search(r"compute on the device what only they read \(aten::argmax\): .* the "
                      r"run saves ([\d.]+ (?:ms|us|ns)) in all", f.recommendation)
    assert found, f.recommendation
    saved = step_time(read) - step_time(outputs)
    assert saved > f.time_lost_ns * 1.1  # the argmax is worth saying
    assert _ns(found.group(1)) == pytest.approx(saved, rel=0.02), (found.group(1), saved)


def _ns(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"ns": 1, "us": 1e3, "ms": 1e6}[unit]
