"""The reference transformer's training step, compiled: the loss curve of eager (which
equals the CPU's, tests/backend/test_loss_curves.py) over 50 steps, far fewer launches
per step and less device time than eager."""

from __future__ import annotations

import pytest
import torch
from neuron_explorer.backend import devices
from neuron_explorer.workloads.models import lm_loss
from neuron_explorer.workloads.training import make_model, token_batches, train

STEPS = 50
BATCH = 8  # train()'s default for the transformer


def compiled_training(steps: int, recorder) -> tuple[list[float], list[int], list[int]]:
    """train() for the transformer, with the loss step compiled; returns the losses and
    the launches and device busy ns of each step."""
    model = make_model("gpt").to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(tokens, targets):
        return lm_loss(model(tokens), targets)

    step_fn = torch.compile(loss_of, backend="neuron")
    timeline = devices.get(0).timeline
    losses, launches, busy = [], [], []
    cfg = model.cfg
    for x, y in token_batches(steps, BATCH, cfg.seq_len, cfg.vocab_size):
        ops_before, busy_before = len(recorder.ops), timeline.busy_ns
        loss = step_fn(x.to("neuron"), y.to("neuron"))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step_ops = recorder.ops[ops_before:]
        launches.append(sum(1 for op in step_ops if op.kernel_ids))
        busy.append(timeline.busy_ns - busy_before)
    return losses, launches, busy


@pytest.mark.slow
def test_compiled_transformer_matches_the_eager_curve_with_fewer_launches(recorder):
    compiled, compiled_launches, compiled_busy = compiled_training(STEPS, recorder)
    reference = train(make_model("gpt"), "cpu", STEPS)
    for step, (a, b) in enumerate(zip(reference, compiled)):
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
