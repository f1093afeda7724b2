"""The reference transformer's training step, compiled: the loss curve of eager (which
equals the CPU's, tests/backend/test_loss_curves.py) over 50 steps, far fewer launches
per step and less device time than eager."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch  # noqa: F401  (first, as programs do: torch then loads the backend whole)
from neuron_explorer.backend import devices
from neuron_explorer.workloads.training import make_model, train

STEPS = 50


def compiled_training(steps: int, recorder) -> tuple[list[float], list[int], list[int]]:
    """train() for the transformer with the loss step compiled; returns the losses and
    the launches and device busy ns of each step."""
    timeline = devices.get(0).timeline
    launches, busy = [], []

    @contextmanager
    def measured(step: int) -> Iterator[None]:
        ops_before, busy_before = len(recorder.ops), timeline.busy_ns
        yield
        launches.append(sum(1 for op in recorder.ops[ops_before:] if op.kernel_ids))
        busy.append(timeline.busy_ns - busy_before)

    losses = train(make_model("gpt"), "neuron", steps, compile=True, on_step=measured)
    return losses, launches, busy


@pytest.mark.slow
def test_compiled_transformer_matches_the_eager_curve_with_fewer_launches(recorder):
    compiled, compiled_launches, compiled_busy = compiled_training(STEPS, recorder)
    graphs = recorder.graph_launches()
    assert graphs and all(len(op.kernel_ids) == 1 for op in graphs)  # one program each
    reference = train(make_model("gpt"), "cpu", STEPS)
    for step, (a, b) in enumerate(zip(reference, compiled, strict=True)):
        assert abs(a - b) <= 1e-5 * abs(a), f"step {step}: eager {a} vs compiled {b}"
    assert compiled[-1] < compiled[0]

    recorder.clear()
    busy_before = devices.get(0).timeline.busy_ns
    train(make_model("gpt"), "neuron", 2)  # two eager steps, for their launches
    eager_launches = sum(1 for op in recorder.ops if op.kernel_ids) / 2
    eager_busy = (devices.get(0).timeline.busy_ns - busy_before) / 2
    steady_launches = max(compiled_launches[1:])
    assert steady_launches * 5 < eager_launches, (steady_launches, eager_launches)
    assert max(compiled_busy[1:]) < eager_busy
