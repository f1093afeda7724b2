"""A graph break in the user's compiled code: the program runs as it does on the CPU.

At a break, the compiled function runs the user's `if` on a tensor outside its graphs,
which reaches the device's kernels from C++ while Dynamo still watches every new frame:
Dynamo must leave the device's own Python code alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def _forward(lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = torch.relu(lin(x))
    if h.mean() > 0.5:  # a data-dependent branch: Dynamo breaks the graph here
        h = h * 0.5
    return h.sum()


def _run(device: str, backend: str) -> tuple[list[float], list[torch.Tensor]]:
    """Three compiled steps (forward, branch, backward) on `device`: losses and grads."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    # shifted inputs: the steps take both ways of the branch
    inputs = [torch.randn(4, 8) + shift for shift in (0.0, 3.0, -3.0)]
    lin.to(device)
    step = torch.compile(lambda x: _forward(lin, x), backend=backend)
    losses, grads = [], []
    for x in inputs:
        loss = step(x.to(device))
        loss.backward()
        losses.append(loss.item())
        grads.append(lin.weight.grad.cpu().clone())
        lin.weight.grad = None
    return losses, grads


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_data_dependent_branch_runs_compiled_on_neuron_as_on_the_cpu() -> None:
    cpu_losses, cpu_grads = _run("cpu", "eager")
    losses, grads = _run("neuron", "neuron")
    assert losses == pytest.approx(cpu_losses, rel=1e-5)
    for grad, cpu_grad in zip(grads, cpu_grads, strict=True):
        torch.testing.assert_close(grad, cpu_grad, rtol=1e-5, atol=1e-6)

