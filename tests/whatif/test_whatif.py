"""What-if replay: an eager trn1 recording predicted on trn3 matches a real trn3 recording
of the same program; other modes and dtypes; traces that cannot be predicted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from neuron_explorer import load, whatif
from neuron_explorer.cli import main
from neuron_explorer.report import render_report
from neuron_explorer.trace_diff import diff
from neuron_explorer.what_if.replay import WhatIfError

pytestmark = pytest.mark.slow  # each workload is recorded in its own process

SAMPLES = Path(__file__).parents[2] / "sample_traces"
BEFORE_OP_KEYS = Path(__file__).parents[1] / "data" / "before_op_keys.pftrace"


@pytest.mark.parametrize("name", ["mlp", "device_bound", "conv"])
def test_trn1_predicted_on_trn3_matches_a_trn3_recording(recordings, tmp_path, name):
    source = load(recordings(name, "trn1"))
    real = load(recordings(name, "trn3"))
    predicted = whatif(source, "trn3", output=tmp_path / "p.pftrace")
    pk, rk = predicted.kernels, real.kernels
    assert len(pk) == len(rk) > 0
    assert (pk["name"].to_numpy() == rk["name"].to_numpy()).all()
    error = np.abs(pk["dur"].to_numpy() - rk["dur"].to_numpy()) / rk["dur"].to_numpy()
    assert error.max() <= 0.01
    steps_p, steps_r = predicted.steps["dur"].to_numpy(), real.steps["dur"].to_numpy()
    assert len(steps_p) == len(steps_r) >= 3
    assert (np.abs(steps_p / steps_r - 1) <= 0.05).all()
    # the prediction is not the recording: the device times changed
    assert not np.array_equal(source.kernels["dur"].to_numpy(), pk["dur"].to_numpy())
    # its host slices nest as the recording's (a sync of no length at an op's start was
    # written inside that op, and its finding lost)
    def nesting(trace):
        s = trace.table("slices")
        s = s[~s["kind"].isin(["metadata", "kernel"])]
        return list(zip(s["name"].astype(str), s["depth"], strict=True))
    assert nesting(predicted) == nesting(real)


def test_syncs_are_re_derived_on_a_device_bound_run(recordings, tmp_path):
    source = load(recordings("device_bound", "trn1"))
    real = load(recordings("device_bound", "trn3"))
    predicted = whatif(source, "trn3", output=tmp_path / "p.pftrace")
    waits = [t.table("slices").loc[t.table("slices")["kind"] == "sync", "dur"].to_numpy()
             for t in (source, predicted, real)]
    assert waits[0].sum() > 0  # the host does wait for the device here
    assert not np.array_equal(waits[0], waits[1])  # re-derived, not copied
    assert np.allclose(waits[1], waits[2], rtol=0.01)


def test_prediction_says_what_it_is(recordings, tmp_path):
    path = recordings("mlp", "trn1")
    predicted = whatif(path, "trn2", dtype="bf16", output=tmp_path / "p.pftrace")
    meta = predicted.metadata["whatif"]
    assert meta["prediction"] is True and meta["from"] == str(path)
    assert (meta["recorded_hardware"], meta["hardware"], meta["dtype"]) == ("trn1", "trn2", "bf16")
    assert predicted.hardware == "trn2"
    assert "what-if prediction from" in render_report(predicted, "text")
    assert "trn2, predicted" in diff(load(path), predicted).render("text")
    with pytest.raises(WhatIfError, match="itself a prediction"):
        whatif(predicted, "trn3")


def test_bf16_makes_matmuls_bf16_and_faster(recordings, tmp_path):
    source = load(recordings("device_bound", "trn1"))
    predicted = whatif(source, dtype="bf16", output=tmp_path / "p.pftrace")
    mm = predicted.kernels[predicted.kernels["name"].str.startswith("mm")]
    before = source.kernels[source.kernels["name"].str.startswith("mm")]
    assert len(mm) == len(before) > 0
    assert mm["name"].str.contains("bf16").all()
    assert mm["dur"].sum() < before["dur"].sum()
    # the recording's FP32 matmuls are found; the prediction runs them in bf16 (its ops
    # keep the recorded dtypes: it was told to run them in bf16)
    assert "fp32_matmul" in {f.rule_id for f in source.bottlenecks()}
    assert "fp32_matmul" not in {f.rule_id for f in predicted.bottlenecks()}


def test_launch_overhead_moves_the_host(recordings, tmp_path):
    source = load(recordings("mlp", "trn1"))
    slow = whatif(source, launch_overhead_us=200, output=tmp_path / "p.pftrace")
    launched = slow.ops[slow.ops["kernel_count"] > 0]
    assert (launched["dur"] == 200_000).all()
    assert slow.steps["dur"].sum() > source.steps["dur"].sum()


def test_compiled_mode_launches_one_program_per_graph(recordings, tmp_path):
    source = load(recordings("mlp", "trn1"))
    predicted = whatif(source, mode="compiled", output=tmp_path / "p.pftrace")
    graphs = predicted.ops[predicted.ops["name"].str.startswith("graph:")]
    assert len(graphs) == 2 * 3  # forward and backward of each step
    assert len(predicted.kernels) < len(source.kernels)
    assert predicted.metadata["whatif"]["approximations"]


def test_engine_level_prediction_has_instructions(recordings, tmp_path):
    predicted = whatif(recordings("device_bound", "trn1", "engine"), "trn3",
                       output=tmp_path / "p.pftrace")
    instructions = predicted.instructions
    assert len(instructions) > 0
    assert set(instructions["kernel_id"]) <= set(predicted.kernels["kernel_id"])


def test_framework_level_recording_names_the_level_needed(recordings):
    with pytest.raises(WhatIfError, match="--level framework.*op-level or engine-level"):
        whatif(recordings("mlp", "trn1", "framework"), "trn3")


def test_compiled_recording_is_refused(recordings):
    with pytest.raises(WhatIfError, match="compiled-graph launches"):
        whatif(recordings("mlp", "trn1", compiled=True), "trn3")


def test_cut_short_recording_is_refused(recordings, tmp_path):
    """A killed recording keeps its step marks but loses its last ops: predicting it would
    compare whole steps with steps replayed without their work."""
    from neuron_explorer.common.errors import TruncatedTraceWarning

    data = recordings("mlp", "trn1").read_bytes()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.warns(TruncatedTraceWarning):
        trace = load(cut)
    with pytest.raises(WhatIfError, match="cut short"):
        whatif(trace, "trn3", output=str(tmp_path / "predicted.pftrace"))


def test_a_cut_short_recordings_findings_replay_its_whole_steps(tmp_path):
    """The rules' predictions compare the analysed steps, which end before the cut: a
    killed recording's host-bound finding is its replay's, per step as the whole
    recording's (it fell back to the gaps, 3.4 ms a step where compiling saved 1.3)."""
    from neuron_explorer.analyses.steady_state import in_analysed_steps
    from neuron_explorer.rules.host_bound import compiled_saving_ns
    from neuron_explorer.what_if.replay import predicted_step_ns

    path = Path(__file__).parents[2] / "sample_traces" / "mlp_eager.pftrace"
    cut = tmp_path / "cut.pftrace"
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    whole = load(path, cache=False)
    with pytest.warns(Warning, match="was the recording killed"):
        part = load(cut, cache=False)
    steps, all_steps = (len(in_analysed_steps(t, t.steps)) for t in (part, whole))
    assert 1 < steps < all_steps
    assert predicted_step_ns(part) == pytest.approx(predicted_step_ns(whole), rel=0.05)
    per_step = compiled_saving_ns(whole) / all_steps
    assert compiled_saving_ns(part) / steps == pytest.approx(per_step, rel=0.05)


def test_cli_writes_the_prediction_and_prints_the_diff(recordings, tmp_path, capsys):
    out = tmp_path / "cli.pftrace"
    assert main(["whatif", str(recordings("mlp", "trn1")), "--hardware", "trn3",
                 "-o", str(out)]) == 0
    assert "trn3, predicted" in capsys.readouterr().out
    assert load(out).metadata["whatif"]["hardware"] == "trn3"
    assert main(["whatif", str(BEFORE_OP_KEYS)]) == 2  # a recording from before op keys
    assert "op keys" in capsys.readouterr().err


def test_rules_state_the_predicted_saving(recordings):
    trace = load(recordings("device_bound", "trn1"))
    text = " ".join(f.explanation + f.recommendation for f in trace.bottlenecks())
    assert "what-if replay" in text


def test_report_and_whatif_state_one_compiled_prediction(recordings, tmp_path):
    """`report`'s prediction line (host_bound) and `whatif --mode compiled` once differed
    (6.16 against 5.06 ms): they come from one replay over the same analysed steps."""
    from neuron_explorer.what_if.compiled import compiled_call_host_ns
    from neuron_explorer.what_if.replay import predicted_step_ns

    source = load(recordings("mlp", "trn1"))
    predicted = whatif(source, mode="compiled", output=tmp_path / "p.pftrace")
    assert predicted_step_ns(source) == predicted.summary()["step_time_ns"]
    # each graph call pays torch.compile's host work on the recording's clock (modelled
    # here: the per-launch Python), not 0, around its op slice: the launch alone
    graphs = predicted.ops[predicted.ops["name"].str.startswith("graph:")]
    overhead = source.hardware_figures.get("host_launch_overhead_ns") or 0
    assert compiled_call_host_ns(source) == source.metadata["host_clock"]["python_per_op_ns"]
    assert (graphs["dur"] == overhead).all()


@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_a_prediction_on_other_hardware_finds_what_a_recording_there_finds(recordings,
                                                                            tmp_path, name):
    """A trn1 prediction's findings were estimates where the trn1 recording's were replays
    (host_bound 764 us a step against 1462; memory_bound_ops and fp32_matmul listed that
    the recording did not): the rules replay a prediction that only moved the recording to
    other hardware, as they replay a recording made there."""
    predicted = whatif(load(recordings(name, "trn1")), "trn3", output=tmp_path / "p.pftrace")
    real = load(recordings(name, "trn3"))
    found_p = {f.rule_id: f for f in predicted.bottlenecks() if f.saves_time}
    found_r = {f.rule_id: f for f in real.bottlenecks() if f.saves_time}
    assert found_p.keys() == found_r.keys() and found_r
    for rule, f in found_r.items():
        assert found_p[rule].time_lost_ns == pytest.approx(f.time_lost_ns, rel=0.05), rule
        assert found_p[rule].saving_basis.split(":")[0] == f.saving_basis.split(":")[0], rule
    # a prediction in another dtype is not what its preset and op keys say: not replayed
    bf16 = whatif(load(recordings(name, "trn1")), dtype="bf16", output=tmp_path / "b.pftrace")
    assert not any(f.saving_basis.startswith("replay") for f in bf16.bottlenecks()
                   if f.rule_id in ("memory_bound_ops", "fp32_matmul"))
