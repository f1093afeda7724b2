"""A rule's compiled prediction stays within what a report can wait for: a program over the
dependency budget is given up, as soon as it passes it (the padded matmuls of
odd_dims.pftrace once made one of 75 M dependencies, 25-80 s of scheduling in
`neuron-explorer report`; they are predicted now), and small programs are predicted."""

from __future__ import annotations

import re
from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.what_if import replay as whatif_replay
from neuron_explorer.what_if.compiled import ProgramTooLarge

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_a_program_over_the_budget_is_not_scheduled(monkeypatch) -> None:
    from neuron_explorer.what_if import compiled as whatif_compiled

    trace = neuron_explorer.load(SAMPLES / "mlp_eager.pftrace")
    assert whatif_replay.predicted_step_ns(trace, "compiled") is not None  # small: predicted

    def refuse(*args, **kwargs):
        raise AssertionError("scheduled a program over the budget")

    small = neuron_explorer.load(SAMPLES / "mlp_eager.pftrace")
    monkeypatch.setattr(whatif_replay, "PREDICTION_MAX_DEPENDENCIES", 0)
    monkeypatch.setattr("neuron_explorer.backend.hardware.builder.KernelBuilder.build", refuse)
    assert whatif_replay.predicted_step_ns(small, "compiled") is None
    assert whatif_replay.prediction_too_large(small, "compiled")
    assert not whatif_replay.prediction_too_large(trace, "compiled")
    with pytest.raises(ProgramTooLarge):
        from neuron_explorer.backend.replay import ReplayOptions
        from neuron_explorer.what_if.writer import host_events

        rows, events = host_events(small, whatif_replay.recorded_ops(small))
        whatif_compiled.replay_compiled(small, rows, events, ReplayOptions("trn2"), 0)


def test_the_host_bound_finding_skips_a_prediction_over_the_budget(monkeypatch) -> None:
    monkeypatch.setattr(whatif_replay, "PREDICTION_MAX_DEPENDENCIES", 50_000)
    trace = neuron_explorer.load(SAMPLES / "odd_dims.pftrace")
    (finding,) = [f for f in trace.bottlenecks() if f.rule_id == "host_bound"]
    assert "what-if replay predicts" not in finding.recommendation
    # ... and points to the command that replays it whole
    assert ("`neuron-explorer whatif TRACE --mode compiled` replays the run"
            in finding.recommendation)


def test_odd_dims_padded_matmuls_are_predicted_within_the_budget() -> None:
    """Their programs once held 36-75 M dependencies (every instruction of an op waited for
    each of the 2,048 its producer finished with) and were given up; waiting for the last
    to end on each engine is the same schedule with a few each."""
    trace = neuron_explorer.load(SAMPLES / "odd_dims.pftrace")
    assert whatif_replay.predicted_step_ns(trace, "compiled") is not None
    (finding,) = [f for f in trace.bottlenecks() if f.rule_id == "host_bound"]
    assert "what-if replay predicts" in finding.recommendation
    # with what compiling costs first, and over how many steps it pays back
    said = re.search(r"each second of compiling pays back over about ([\d,]+) steps",
                     finding.recommendation)
    assert said and "again for each new input shape" in finding.recommendation
    recorded = float(trace.steps["dur"].median())
    predicted = whatif_replay.predicted_step_ns(trace, "compiled")
    assert int(said.group(1).replace(",", "")) == round(1e9 / (recorded - predicted))


def test_a_program_past_the_budget_is_given_up_as_it_passes_it(monkeypatch) -> None:
    """Its instructions stop being added once their dependencies pass the budget: odd_dims'
    backward program was added whole (82 K instructions, 36 M dependencies, 1.3 s) before
    it was refused."""
    from neuron_explorer.backend.hardware.builder import KernelBuilder

    added: list[str] = []
    add = KernelBuilder.add

    def counted(self, *args, **kwargs):
        added.append(self.name)
        return add(self, *args, **kwargs)

    def graphs_added() -> dict[str, int]:
        trace = neuron_explorer.load(SAMPLES / "odd_dims.pftrace")
        whatif_replay.prediction_too_large(trace, "compiled")
        return {name: added.count(name) for name in dict.fromkeys(added)
                if name.startswith("graph_")}

    monkeypatch.setattr(KernelBuilder, "add", counted)
    whole = graphs_added()
    added.clear()
    monkeypatch.setattr(whatif_replay, "PREDICTION_MAX_DEPENDENCIES", 50_000)
    refused = graphs_added()
    (name, count), = list(refused.items())[-1:]
    assert count < whole[name] / 4, (count, whole)
