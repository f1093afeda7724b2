"""`whatif --mode compiled` against a compiled recording of the same script. Each graph call
once cost 650 us in the graph op's own slice, the loss and zero_grad were folded into the
forward graph, and the module's Python around the graph was kept: a host-bound script that
compiling made 34% faster was predicted no faster, with host op_dispatch rising (tmp audit
s3, 1.63 ms predicted against 1.06 ms compiled).

The prediction is compared with the compiled recording on the modelled host clock, where
both are the same every run: there the replay's shape of a compiled step (which ops become
graphs, what the host pays per call) is the only thing that can differ. On the measured
clock the prediction adds torch.compile's per-call host work as figures fitted on a
reference host (docs/whatif.md), while the compiled recording measures it on this machine
as loaded as it is: beside a memory-bound and a CPU-bound process, the compiled recording's
step grew 40% and the prediction 10%. How close they come there is a benchmark's figure
on a quiet host (`benchmarks/bench_whatif_compiled.py`), not a test's; what the measured
clock must show whatever the load is checked here within one recording."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("compiled_host")
    paths = record_variants(folder, PROGRAM, {"eager": ["8"]})
    paths |= record_variants(folder, PROGRAM, {"modelled_eager": ["8"],
                                               "modelled_compiled": ["8", "--compile"]},
                             modelled=True)
    return {name: load(path) for name, path in paths.items()}



def test_the_compiled_prediction_is_the_compiled_recording_on_the_modelled_clock(
        recorded) -> None:
    from neuron_explorer.what_if.replay import predicted_step_ns

    eager, compiled = recorded["modelled_eager"], recorded["modelled_compiled"]
    predicted = predicted_step_ns(eager)
    assert predicted is not None
    assert predicted < 0.5 * median_step(eager), "compiling this host-bound MLP helps"
    assert predicted == pytest.approx(median_step(compiled), rel=0.02)


def test_the_measured_prediction_keeps_what_a_compiled_run_keeps(recorded, tmp_path) -> None:
    from neuron_explorer.what_if.replay import predicted_step_ns, whatif

    eager = recorded["eager"]
    predicted = predicted_step_ns(eager)
    assert predicted is not None
    assert predicted < 0.9 * median_step(eager), "compiling this host-bound MLP helps"
    # a graph's op slice is its launch, as in a compiled recording: torch.compile's own
    # work is the host's Python around it, not op dispatch
    trace = whatif(eager, mode="compiled", output=tmp_path / "p.pftrace")
    graphs = trace.ops[trace.ops["name"].str.startswith("graph:")]
    recorded_graphs = recorded["modelled_compiled"].ops
    recorded_graphs = recorded_graphs[recorded_graphs["name"].str.startswith("graph:")]
    assert len(graphs) and np.allclose(graphs["dur"], recorded_graphs["dur"].median())
    # the loss stays eager, as torch.compile(model) leaves it
    assert {"aten::pow", "aten::mean"} <= set(trace.ops["name"])


def test_a_prediction_the_device_paces_is_the_devices_pace(tmp_path) -> None:
    """Compiled, a 512-wide MLP on 8192 rows needs 0.64 ms of host a step and 2.1 ms of
    device: the host runs ahead and the run goes at the device's pace. The rules once
    stated the host's 0.64 ms as the compiled step, where `whatif` wrote a trace whose
    report said 2.29 ms; both now state the device's pace, near the compiled recording's."""
    from neuron_explorer.what_if.replay import predicted_step_ns, whatif

    wide = ["2", "--width", "512", "--batch", "8192"]
    paths = record_variants(tmp_path, PROGRAM, {"eager": wide,
                                                "compiled": [*wide, "--compile"]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    predicted = predicted_step_ns(eager)
    assert predicted is not None
    assert predicted == pytest.approx(compiled.summary()["step_time_ns"], rel=0.15)
    trace = whatif(eager, mode="compiled", output=tmp_path / "p.pftrace")
    assert predicted == trace.summary()["step_time_ns"]


def test_compiling_saves_more_than_the_launch_gaps_where_fusion_shortens_the_device(
        tmp_path) -> None:
    """A small CNN: compiled, its host launches far fewer ops and its device runs fused
    kernels. host_bound once stated the lesser of the launch gaps and the compiled
    replay; with a compiled backward graph that computed a grad_input nobody asked for
    (the mask dropped from its key), the recording ran slower than the replay and the cap
    looked safe. With the graph right, the replay is what compiling saves and the gaps
    are less."""
    program = Path(__file__).parent / "programs" / "small_cnn.py"
    paths = record_variants(tmp_path, program, {"eager": [], "compiled": ["--compile"]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    (f,) = [f for f in eager.bottlenecks() if f.rule_id == "host_bound"]
    # 10.4 ms over the analysed steps where the launch gaps are 8.1 ms (modelled clock)
    assert f.saving_basis.startswith("replay") and f.time_lost_ns > f.symptom_ns
    per_step = median_step(eager) - median_step(compiled)
    analysed = len(in_analysed_steps(eager, eager.steps))
    assert f.time_lost_ns == pytest.approx(per_step * analysed, rel=0.1)
