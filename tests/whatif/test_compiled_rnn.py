"""torch.compile runs nn.RNN, nn.GRU and nn.LSTM eager unless
`torch._dynamo.config.allow_rnn = True`: Dynamo breaks its graph around them. The
compiled what-if compiled them anyway, and an embedding + GRU model (51 ms a step, its
GRU hundreds of small kernels) was told compiling saves 352 ms of its 7 steps, where
compiling as is changed nothing. The recorder marks such modules; the prediction keeps
them eager, or with `--allow-rnn` compiles them as that setting does, and `host_bound`
advises the setting with the step it predicts. All on the modelled clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.what_if.replay import WhatIfError, predicted_step_ns, whatif

pytestmark = pytest.mark.slow  # three recordings of a small GRU model
PROGRAM = Path(__file__).parent / "programs" / "small_gru.py"



def test_a_gru_stays_eager_compiled_unless_dynamo_is_allowed_to_trace_it(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {
        "eager": [], "compiled": ["--compile"], "allowed": ["--compile", "--allow-rnn"]},
        modelled=True)
    eager, compiled, allowed = (load(paths[n]) for n in ("eager", "compiled", "allowed"))
    # compiled as is, the GRU's kernels still launch one by one
    assert median_step(compiled) > 0.5 * median_step(eager)
    assert predicted_step_ns(eager, "compiled") == pytest.approx(median_step(compiled),
                                                                 rel=0.1)
    assert predicted_step_ns(eager, "compiled_allow_rnn") == pytest.approx(
        median_step(allowed), rel=0.05)
    (finding,) = [f for f in eager.bottlenecks() if f.rule_id == "host_bound"]
    assert "torch._dynamo.config.allow_rnn = True" in finding.recommendation
    # the sequences' advice too: compiled as it said, a trial's LSTM ran as before
    (sequences,) = [f for f in eager.bottlenecks() if f.rule_id == "short_kernel_sequence"]
    assert "torch._dynamo.config.allow_rnn = True" in sequences.recommendation
    assert "`model.rnn` would run eager" in finding.recommendation
    assert "--mode compiled --allow-rnn" in finding.recommendation
    predicted = whatif(eager, mode="compiled", allow_rnn=True,
                       output=tmp_path / "allowed.pftrace")
    assert predicted.summary()["step_time_ns"] == pytest.approx(median_step(allowed), rel=0.05)

    # the run compiled as is: Dynamo gave up the model's frame, which ran eager. Its report
    # said "the model is already compiled" (a compile span of no graph) and named no
    # graph break; now the break, with Dynamo's hint, and the setting that compiles it
    found = {f.rule_id: f for f in compiled.bottlenecks()}
    assert "Attempted to wrap RNN, GRU, or LSTM" in found["recompilation"].explanation
    assert "allow_rnn=True" in found["recompilation"].recommendation
    assert "already compiled" not in found["host_bound"].recommendation
    assert "torch._dynamo.config.allow_rnn = True" in found["host_bound"].recommendation
    # and the break's own finding claims what the setting saves: it was "no time to save
    # now" where a trial's LSTM saved 215 ms of a 218 ms step
    steps = len(in_analysed_steps(compiled, compiled.steps))
    saved = (median_step(compiled) - median_step(allowed)) * steps
    assert found["recompilation"].time_lost_ns == pytest.approx(saved, rel=0.1)
    assert "allow_rnn = True` set before compiling it compiles whole" in \
        found["recompilation"].explanation


def test_options_a_compiled_prediction_cannot_honour_are_refused(tmp_path) -> None:
    trace = load(Path(__file__).parents[2] / "sample_traces" / "mlp_eager.pftrace")
    with pytest.raises(WhatIfError, match="--dtype is predicted for eager runs only"):
        whatif(trace, mode="compiled", dtype="bf16", output=tmp_path / "p.pftrace")
    with pytest.raises(WhatIfError, match="--allow-rnn goes with --mode compiled"):
        whatif(trace, allow_rnn=True, output=tmp_path / "p.pftrace")
