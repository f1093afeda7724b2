"""A foreach or single-tensor Adam: what the findings say `fused=True` saves, against a
recording of the same script with it.

The replay makes each recorded optimizer step's passes over the parameters the one kernel
the fused step runs, lowered for the same parameters, with the state-step increments the
fused step makes on the device. The model is compiled, so the optimizer is all the replay
changes. The run is host-bound and its host-bound finding leads with fused=True, stating
what it saves a step; `memory_bound_ops` once stated the device time of the same fix as a
saving "next, after the host-bound fix", and before that the time the memory-bound ops
spent above the compute roof, which no fix removes. Modelled host clock: exact every run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


def _step_ns(trace) -> float:
    return float(in_analysed_steps(trace, trace.steps)["dur"].mean())


def _device_ns(trace) -> float:
    return float(in_analysed_steps(trace, trace.kernels)["dur"].sum())


def _states_fused_true(trace) -> bool:
    """Whether a memory_bound_ops finding claims fused=True's saving."""
    return any(f.rule_id == "memory_bound_ops" and "fused=True" in f.recommendation
               for f in trace.bottlenecks())


def test_the_fused_optimizers_saving_is_what_fused_true_saves(tmp_path) -> None:
    base = ["2", "--compile", "--width", "512", "--batch", "64", "--optimizer"]
    paths = record_variants(tmp_path, PROGRAM, {o: [*base, o] for o in (
        "adam", "adam-loop", "adam-fused")}, modelled=True)
    fused = load(paths["adam-fused"])
    assert not [f for f in fused.bottlenecks() if f.rule_id == "memory_bound_ops"]
    for unfused in ("adam", "adam-loop"):
        trace = load(paths[unfused])
        # the host-bound finding's fix is fused=True: nothing more is claimed for it
        assert not _states_fused_true(trace)
        # the compiled model leaves the optimizer's launches most of the host's: host_bound
        # names them first, where it told a compiled run only to raise the batch size
        (host,) = [f for f in trace.bottlenecks() if f.rule_id == "host_bound"]
        # (most of them for the per-parameter loop; 44% of its op time for foreach Adam)
        lead = "Most of the host's launches are" if unfused == "adam-loop" else \
            "The largest part of the host's launches is"
        assert host.recommendation.startswith(f"{lead} the optimizer's step"), \
            host.recommendation
        # and says what fused=True saves a step, host and device, by replay: its launches
        # gone (the state-step increments stay, as the fused step makes them too)
        said = re.search(r"fused=True \(one kernel a step: replayed so, each step takes "
                         r"([\d.]+) (us|ms) less\)", host.recommendation)
        assert said, host.recommendation
        claimed = float(said.group(1)) * (1e3 if said.group(2) == "us" else 1e6)
        step_saved = _step_ns(trace) - _step_ns(fused)
        assert claimed == pytest.approx(step_saved, rel=0.2), (unfused, claimed, step_saved)
        if unfused == "adam-loop":  # a kernel per parameter and term: its sequences
            (seq,) = [f for f in trace.bottlenecks() if f.rule_id == "short_kernel_sequence"]
            assert "fused=True" in seq.recommendation
            # host_bound's replay makes the step fused=True too: the two overlap (they
            # were called "beside" each other, as if host_bound's replay left it out)
            assert "overlap rather than add" in seq.explanation
            assert "beside that one" not in seq.explanation
        # the replay's device time is the fused recording's
        saved = _device_ns(trace) - _device_ns(fused)
        replayed = fused_optimizer_saving(trace)
        assert replayed is not None and replayed.device_ns == pytest.approx(saved, rel=0.01), (
            unfused, replayed, saved)
        # foreach=False runs each pass one op per parameter (two layers: four)
        assert (replayed.single_tensor, replayed.parameters) == (unfused == "adam-loop", 4)


def test_foreach_adamws_two_multiplies_are_one_pass_each_over_every_parameter(
        tmp_path) -> None:
    """AdamW's foreach step makes one pass twice (`_foreach_mul_`: the weight decay, then
    the second moment), which read as a step of one tensor per parameter: the fused kernel
    was lowered for one parameter of 34 and a transformer's saving claimed 306 us a step
    of device time where fused=True saved 203; the step's own saving left out the launch
    of the state-step increments the fused step makes on the device (420 us claimed, 372
    saved).

    The same script eager is host-bound, and compiling is host_bound's fix: the device work
    compiling fuses is in that finding's saving. What fused=True saves there is
    unfused_optimizer's to state, as step time (memory_bound_ops stated it as device time
    after the host-bound fix, once adding compiling's too: 1.76 ms claimed, 1.18 saved)."""
    base = ["2", "--width", "512", "--batch", "64", "--optimizer"]
    paths = record_variants(tmp_path, PROGRAM, {
        "adamw": [*base, "adamw", "--compile"], "adamw-fused": [*base, "adamw-fused", "--compile"],
        "eager": [*base, "adamw"], "eager-fused": [*base, "adamw-fused"]}, modelled=True)
    trace, fused = load(paths["adamw"]), load(paths["adamw-fused"])
    assert not _states_fused_true(trace)  # the host-bound finding's fix, below
    replayed = fused_optimizer_saving(trace)
    assert replayed is not None and replayed.passes == 8
    saved = _device_ns(trace) - _device_ns(fused)
    assert replayed.device_ns == pytest.approx(saved, rel=0.01), (replayed.device_ns, saved)
    eager_trace = load(paths["eager"])
    eager = {f.rule_id: f for f in eager_trace.bottlenecks()}
    assert "host_bound" in eager
    unfused = eager["unfused_optimizer"]
    # the steady steps: the fused run's first step, which makes the optimizer's state, is
    # not analysed, the unfused run's is
    eager_fused = load(paths["eager-fused"])
    step_saved = float(in_analysed_steps(eager_trace, eager_trace.steps)["dur"].median()
                       - in_analysed_steps(eager_fused, eager_fused.steps)["dur"].median())
    assert unfused.time_lost_ns / unfused.steps == pytest.approx(step_saved, rel=0.1), (
        unfused.time_lost_ns / unfused.steps, step_saved)
    assert "fused=True" not in (eager["memory_bound_ops"].recommendation
                                if "memory_bound_ops" in eager else "")
    # its small transfers are the eager ops' that compiling fuses (0.57 ms claimed again)
    assert "small_dma" not in eager
    # the optimizer's small transfers (those of step 0, outside the analysed steps, were
    # named) are fused=True's to save, stated above; a fused step's are its parameters'
    # sizes, nothing to change: neither is small_dma's
    for t in (trace, fused):
        (dma,) = [f for f in t.bottlenecks() if f.rule_id == "small_dma"]
        assert "optimizer" not in dma.recommendation, dma.recommendation
    assert "88 small transfers of the fused optimizer step (one kernel" in dma.explanation
    (host,) = [f for f in trace.bottlenecks() if f.rule_id == "host_bound"]
    said = re.search(r"each step takes ([\d.]+) (us|ms) less", host.recommendation)
    assert said, host.recommendation
    claimed = float(said.group(1)) * (1e3 if said.group(2) == "us" else 1e6)
    assert claimed == pytest.approx(_step_ns(trace) - _step_ns(fused), rel=0.05)


def test_sequences_that_are_all_the_optimizers_claim_what_fused_true_saves(tmp_path) -> None:
    """Model and loss compiled, every short-kernel sequence left is foreach Adam's passes.
    Each occurrence fused alone was claimed (372 us a step); fused=True, the fix named,
    keeps a launch and the state steps' increments and saved 310."""
    base = ["2", "--compile", "--compile-loss", "--width", "512", "--batch", "64",
            "--optimizer"]
    paths = record_variants(tmp_path, PROGRAM, {o: [*base, o] for o in (
        "adam", "adam-fused")}, modelled=True)
    trace, fused = load(paths["adam"]), load(paths["adam-fused"])
    (seq,) = [f for f in trace.bottlenecks() if f.rule_id == "short_kernel_sequence"]
    steps = len(in_analysed_steps(trace, trace.steps))
    saved = (_step_ns(trace) - _step_ns(fused)) * steps
    assert seq.time_lost_ns == pytest.approx(saved, rel=0.05), (seq.time_lost_ns, saved)
    assert "every occurrence is the optimizer's step, and fused=True saves" in \
        seq.explanation
