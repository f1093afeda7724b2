"""The promise: the same training script gives the same loss curve on "cpu" and "neuron"."""

from __future__ import annotations

import pytest
from neuron_explorer.workloads.training import make_model, train

STEPS = 50


def _assert_same_curve(cpu: list[float], neuron: list[float]) -> None:
    assert len(cpu) == len(neuron) == STEPS
    for step, (a, b) in enumerate(zip(cpu, neuron, strict=True)):
        assert abs(a - b) <= 1e-5 * abs(a), f"step {step}: cpu {a} vs neuron {b}"
    assert cpu[-1] < cpu[0]  # it is actually training


def test_mlp_loss_curve_matches_cpu():
    cpu = train(make_model("mlp"), "cpu", STEPS)
    neuron = train(make_model("mlp"), "neuron", STEPS)
    _assert_same_curve(cpu, neuron)


@pytest.mark.slow
def test_transformer_loss_curve_matches_cpu():
    cpu = train(make_model("gpt"), "cpu", STEPS)
    neuron = train(make_model("gpt"), "neuron", STEPS)
    _assert_same_curve(cpu, neuron)
