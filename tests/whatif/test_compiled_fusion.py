"""`whatif --mode compiled` fuses along the recorded data flow.

An eager recording says which op made each tensor an op read (`producers`); the compiled
replay fuses chains and GEMM epilogues along it as the compile path does. Emitted op by
op, with every value through HBM, the replay of a 3-layer MLP (512 wide, batch 512)
predicted compiling would save 38 us of device time a step where the compiled recording
saved 125 us; fused along the data flow it predicts 93 us. Both recordings on the
modelled host clock: the same every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.what_if.replay import predicted_device_ns

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


def _per_step(trace, ns: float) -> float:
    return ns / len(in_analysed_steps(trace, trace.steps))


def _device_savings(tmp_path, program: Path, args: list[str], flag: str
                    ) -> tuple[float, float, object]:
    """(the device time a step the replay says compiling saves, what the compiled
    recording (`flag` added) saves, the eager trace)."""
    paths = record_variants(tmp_path, program, {"eager": args, "compiled": [*args, flag]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    before = _per_step(eager, predicted_device_ns(eager, "eager"))
    predicted = before - _per_step(eager, predicted_device_ns(eager, "compiled"))
    measured = before - _per_step(compiled, in_analysed_steps(compiled, compiled.kernels)
                                  ["dur"].sum())
    return predicted, measured, eager


def test_the_compiled_replays_device_saving_is_near_the_compiled_recordings(tmp_path) -> None:
    predicted, measured, _ = _device_savings(
        tmp_path, PROGRAM, ["3", "--width", "512", "--batch", "512", "--item"], "--compile")
    assert 0.6 * measured <= predicted <= 1.1 * measured, (predicted, measured)


def test_an_ops_producers_name_the_ops_that_made_its_inputs(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"eager": ["1"]}, modelled=True)
    trace = load(paths["eager"])
    ops = trace.ops.sort_values("ts")
    ops = ops[ops["step"] == ops["step"].max()]
    made = dict(zip(ops["op_id"], ops["name"], strict=True))
    texts = trace.slice_args.column(tf.ARG_PRODUCERS, ops["id"].to_numpy())
    inputs = {}
    for op_id, name, text in zip(ops["op_id"], ops["name"], texts, strict=True):
        if text:
            inputs[name] = [made.get(op_id - d) for d in json.loads(text) if d]
    # relu reads the addmm's result; the loss's square reads the relu's
    assert inputs["aten::relu"] == ["aten::addmm"]
    assert "aten::relu" in inputs["aten::pow"] + inputs.get("aten::square", [])


def test_memory_bound_ops_states_the_step_time_compiling_saves_a_device_paced_run(
        tmp_path) -> None:
    """A device-paced run (not host-bound): compiling is memory_bound_ops' fix alone, and
    it saves step time (fused kernels, fewer launches), which the finding states, where it
    once stated device time capped by the host's (a 4-block MLP at batch 4096: 5.9 ms
    claimed, 28.7 ms saved)."""
    from neuron_explorer.analyses.device_pace import paced_durations

    args = ["3", "--width", "1024", "--batch", "2048"]
    paths = record_variants(tmp_path, PROGRAM, {"eager": args, "compiled": [*args, "--compile"]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    findings = {f.rule_id: f for f in eager.bottlenecks()}
    assert "host_bound" not in findings
    f = findings["memory_bound_ops"]
    assert f.saving_basis.startswith("replay: the steps replayed compiled")
    pace = [float(np.median(paced_durations(t))) for t in (eager, compiled)]
    saved = (pace[0] - pace[1]) * len(in_analysed_steps(eager, eager.steps))
    assert f.time_lost_ns == pytest.approx(saved, rel=0.2), (f.time_lost_ns, saved)


def test_attention_and_values_kept_on_chip_predict_a_transformers_compiled_saving(
        tmp_path) -> None:
    """examples/gpt.py (nn.MultiheadAttention, two blocks): the compile path keeps each
    attention on chip, hands values between its kernels in SBUF and loads weights ahead;
    the replay fused only each op into the group just before it and sent every value
    through HBM: it predicted 505 us of the 773 us a step compiling saved (0.65; its
    forward moved 30 MB where the compiled one moves 15). A copy's readers read what the
    copy made (`x.contiguous()` is an `empty` and a `_copy_from`)."""
    program = Path(__file__).parents[2] / "examples" / "gpt.py"
    predicted, measured, eager = _device_savings(tmp_path, program, ["--steps", "5"],
                                                 "--compile")
    assert 0.85 * measured <= predicted <= 1.1 * measured, (predicted, measured)

    ops = eager.ops.sort_values("ts")
    names = dict(zip(ops["op_id"], ops["name"], strict=True))
    texts = eager.slice_args.column(tf.ARG_PRODUCERS, ops["id"].to_numpy())
    read_copies = [names.get(op_id - d) == "aten::_copy_from"
                   for op_id, name, text in zip(ops["op_id"], ops["name"], texts, strict=True)
                   if text and name == "aten::mm" for d in json.loads(text) if d]
    assert any(read_copies)


def test_a_loss_module_beside_the_model_stays_eager(tmp_path) -> None:
    """torch.compile(model) leaves the loss eager, whether a function of the output or a
    module (`nn.CrossEntropyLoss()`, a root module range of its own): the replay took
    the module's ops into the model's graphs and predicted a step of 814 us where the
    compiled recording took 1,062 (17 launches a step, not 13)."""
    from neuron_explorer.what_if.replay import predicted_step_ns, whatif

    args = ["2", "--loss-module"]
    paths = record_variants(tmp_path, PROGRAM, {"eager": args, "compiled": [*args, "--compile"]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    recorded = float(in_analysed_steps(compiled, compiled.steps)["dur"].median())
    assert predicted_step_ns(eager) == pytest.approx(recorded, rel=0.02)
    predicted = whatif(eager, mode="compiled", output=tmp_path / "predicted.pftrace")
    assert {"aten::mse_loss", "aten::mse_loss_backward"} <= set(predicted.ops["name"])


def test_a_cnns_compiled_replay_takes_the_device_time_of_its_compiled_recording(
        tmp_path) -> None:
    """A CNN at 64x64, batch 32, whose backward keeps no value on chip: the compile path
    keeps poolings in kernels of their own (neither pointwise nor reductions) and, where
    values held between ops would not fit beside a convolution's working set, builds the
    program again with every value through HBM and nothing loaded ahead. The replay fused
    each pooling into the stream beside it and kept values on chip regardless: its
    backward graph took 824 us where the compiled one took 1,046, and memory_bound_ops
    claimed 343 us a step for compiling where 61 us was saved."""
    from neuron_explorer.what_if.replay import predicted_device_ns

    args = ["--batch", "32", "--size", "64", "--steps", "4"]
    paths = record_variants(tmp_path, Path(__file__).parent / "programs" / "small_cnn.py",
                            {"eager": args, "compiled": [*args, "--compile"]}, modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    predicted = _per_step(eager, predicted_device_ns(eager, "compiled"))
    recorded = _per_step(compiled, in_analysed_steps(compiled, compiled.kernels)["dur"].sum())
    assert predicted == pytest.approx(recorded, rel=0.03), (predicted, recorded)
