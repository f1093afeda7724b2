"""`fp32_matmul` and `whatif --dtype bf16` against the same programs recorded again under
bf16 autocast. Autocast runs the matmuls in bf16, the ops that need range in float32, and
every other op in the dtype its inputs bring: a GELU after a bf16 matmul runs in bf16. The
replay once cast each matmul's output back to float32 and ran the ops after it as
recorded: an MLP's finding claimed 13.2 ms where autocast saved 18.6. On an eager CNN the
casts autocast adds (627 us a step on the audited CNN) outweigh what its convolutions gain,
so the rule gives no advice that would make the run slower."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAMS = Path(__file__).parent / "programs"
PROGRAM = PROGRAMS / "small_cnn_bn.py"
MLP = PROGRAMS / "mlp_precision.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    paths = record_variants(tmp_path_factory.mktemp("fp32_autocast"), PROGRAM,
                            {"fp32": [], "bf16": ["--bf16"]})
    return {mode: load(path) for mode, path in paths.items()}


def _device_per_step(trace) -> float:
    steps = in_analysed_steps(trace, trace.steps)
    return float(in_analysed_work(trace, trace.kernels)["dur"].sum()) / len(steps)


def test_the_bf16_replay_predicts_the_autocast_runs_device_time(recorded, tmp_path) -> None:
    from neuron_explorer.what_if.replay import whatif

    predicted = whatif(recorded["fp32"], dtype="bf16", output=tmp_path / "bf16.pftrace")
    measured = _device_per_step(recorded["bf16"])
    assert abs(_device_per_step(predicted) / measured - 1) < 0.005
    assert measured > _device_per_step(recorded["fp32"])  # autocast made it slower


@pytest.mark.parametrize("program, fp32, autocast, within", [
    (MLP, [], ["--autocast"], 0.005),
    (PROGRAMS / "gpt_train.py", ["--steps", "3"], ["--steps", "3", "--autocast"], 0.01),
], ids=["mlp", "gpt"])
def test_each_op_runs_in_the_dtype_autocast_gives_it(tmp_path, program, fp32, autocast,
                                                     within) -> None:
    """The GELU, the layer norms' and softmax's neighbours, the residual adds and every
    gradient in the dtype autocast runs them in, and its casts where it makes them: the
    predicted device time is the autocast recording's (the MLP's 0.0% off, the GPT's 0.7%
    under. It was 0.09% over while the data flow took `cat.out` to write its inputs, not
    its `out=`: the q, k and v gradients concatenated looked made in float32 by nothing,
    and got casts to bfloat16 before their matmuls that autocast never makes)."""
    from neuron_explorer.what_if.replay import whatif

    paths = record_variants(tmp_path, program, {"fp32": fp32, "autocast": autocast},
                            modelled=True)
    predicted = whatif(load(paths["fp32"]), dtype="bf16", output=tmp_path / "p.pftrace")
    measured = _device_per_step(load(paths["autocast"]))
    assert _device_per_step(predicted) == pytest.approx(measured, rel=within)


def test_the_findings_saving_is_what_autocast_saves(tmp_path) -> None:
    """A device-paced MLP: the finding states what autocast saves over the analysed steps
    (its casts' host time included), and what the model cast whole would."""
    size = ["--width", "1024", "--batch", "1024"]
    paths = record_variants(tmp_path, MLP, {"fp32": size, "autocast": [*size, "--autocast"],
                                            "bf16": [*size, "--bf16"]}, modelled=True)
    fp32, autocast, bf16 = (load(paths[name]) for name in ("fp32", "autocast", "bf16"))
    (f,) = [f for f in fp32.bottlenecks() if f.rule_id == "fp32_matmul"]
    saved = fp32.summary()["total_ns"] - autocast.summary()["total_ns"]
    assert f.time_lost_ns == pytest.approx(saved, rel=0.03), (f.time_lost_ns, saved)
    whole = float(re.search(r"cast to bfloat16 whole pay no casts: up to ([\d.]+) ms",
                            f.explanation).group(1)) * 1e6
    saved_whole = fp32.summary()["total_ns"] - bf16.summary()["total_ns"]
    assert whole == pytest.approx(saved_whole, rel=0.05), (whole, saved_whole)


def test_no_fp32_advice_where_autocast_makes_the_device_slower(recorded) -> None:
    from neuron_explorer.rules import fp32_matmul

    assert fp32_matmul.check(recorded["fp32"]) == []


def test_a_compiled_cnn_is_told_to_cast_the_model_whole(tmp_path) -> None:
    """Compiled, autocast's casts are sections of the graph's program that move data: the
    CNN's compiled step under autocast was 12 us slower than in float32, where the finding
    led with torch.autocast. The model cast whole saves what the finding claims: the
    backend builds each graph's program again with its float32 tensors in bfloat16. The
    claim counted only the Tensor Engine's time before (336 us a step; 667 saved)."""
    paths = record_variants(tmp_path, PROGRAM, {"fp32": ["--compile"],
                                                "bf16": ["--compile", "--bf16"],
                                                "whole": ["--compile", "--whole-bf16"]},
                            modelled=True)
    fp32, bf16, whole = load(paths["fp32"]), load(paths["bf16"]), load(paths["whole"])
    (f,) = [f for f in fp32.bottlenecks() if f.rule_id == "fp32_matmul"]
    assert f.recommendation.startswith("Cast the model to bfloat16 whole, model.to(")
    assert "torch.autocast adds casts" in f.recommendation
    # as the replay has them arrive, and as this program casts them (a trial cast its
    # input after the move, and saved 234 us of 741 claimed)
    assert "Cast the inputs on the host, before they move to the device" in f.recommendation
    assert f.saving_basis.startswith("replay: ")
    # the premise: autocast saved well under the claim
    claimed = f.time_lost_ns / f.steps
    saved = fp32.summary()["step_time_ns"] - bf16.summary()["step_time_ns"]
    assert saved < 0.25 * claimed
    saved = fp32.summary()["step_time_ns"] - whole.summary()["step_time_ns"]
    assert claimed == pytest.approx(saved, rel=0.1), (claimed, saved)
    # each program rebuilt in bfloat16 is as long as the bf16 model's own
    for phase in ("forward", "backward"):
        rebuilt = _rebuilt_ns(fp32, phase)
        ran = whole.kernels.loc[whole.kernels["name"].str.endswith(phase), "dur"].median()
        assert rebuilt == pytest.approx(ran, rel=0.05), (phase, rebuilt, ran)


def test_a_compiled_run_its_host_still_paces_is_claimed_what_casting_saves(tmp_path) -> None:
    """Its loss compiled with the model, its optimizer fused, a loss read every step: the
    host still sets the step, with nothing left to compile. Casting the model whole saved
    77.6 us a step: the fused AdamW's kernel, which the next step's loss read waits on,
    not the graphs (the host launches the optimizer at the same time either way). The
    graphs' device time (69.3 us) was claimed before, right by chance; the critical path
    kept 37.2 us. The run replayed cast whole, the optimizer's kernel too, gives 77.6."""
    program = PROGRAM.parent / "compiled_host_bound.py"
    paths = record_variants(tmp_path, program, {"fp32": [], "whole": ["--whole-bf16"]},
                            modelled=True)
    fp32, whole = load(paths["fp32"]), load(paths["whole"])
    (f,) = [f for f in fp32.bottlenecks() if f.rule_id == "fp32_matmul"]
    claimed = f.time_lost_ns / f.steps
    saved = fp32.summary()["step_time_ns"] - whole.summary()["step_time_ns"]
    assert claimed == pytest.approx(saved, rel=0.02), (claimed, saved)
    assert f.saving_basis.startswith("replay: the run replayed with the model cast whole")


def _rebuilt_ns(trace, phase: str) -> float:
    """The median `whole_bf16_ns` of the trace's compiled `phase` programs."""
    from neuron_explorer.common.trace_format import ARG_WHOLE_BF16_NS
    from neuron_explorer.tables import number

    k = trace.kernels[trace.kernels["name"].str.endswith(phase)]
    return float(pd.Series(number(trace, ARG_WHOLE_BF16_NS, k["id"].to_numpy(), -1)).median())


def test_a_loss_head_outside_autocast_is_told_to_move_inside_it(tmp_path) -> None:
    """The body under autocast, the last layer after the `with` block on `.float()` of its
    output: told to cast its input with .to(torch.bfloat16), the user's head crashed on
    its float32 weight. Moved inside the region (the `.float()` dropped), each step saved
    what the finding says a step saves."""
    size = ["--width", "1024", "--batch", "1024"]
    paths = record_variants(tmp_path, MLP, {"body": [*size, "--autocast-body"],
                                            "whole": [*size, "--autocast"]}, modelled=True)
    body, whole = load(paths["body"]), load(paths["whole"])
    (f,) = [f for f in body.bottlenecks() if f.rule_id == "fp32_matmul"]
    assert "ran outside autocast" in f.recommendation
    assert "Move it inside the autocast region" in f.recommendation
    saved = body.summary()["step_time_ns"] - whole.summary()["step_time_ns"]
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
