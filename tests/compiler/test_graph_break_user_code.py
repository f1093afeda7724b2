"""A graph break in the user's compiled code: the program runs as it does on the CPU, and
the recorded break names the user's line and Dynamo's reason, never the tool's own code.

At a break, the compiled function runs the user's `if` on a tensor outside its graphs,
which reaches the device's kernels from C++ while Dynamo still watches every new frame:
Dynamo must leave the device's own Python code alone."""

from __future__ import annotations

import os

import neuron_explorer
import neuron_explorer.backend
import neuron_explorer.collectors
import pytest
import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.events import CompileEvent, hub
from neuron_explorer.trace import load
from torch import nn

_PACKAGE_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (neuron_explorer.backend, neuron_explorer.collectors))


def _forward(lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = torch.relu(lin(x))
    if h.mean() > 0.5:  # a data-dependent branch: Dynamo breaks the graph here
        h = h * 0.5
    return h.sum()


_BRANCH_LINE = _forward.__code__.co_firstlineno + 2


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


@pytest.mark.usefixtures("fresh_dynamo")
def test_the_graph_break_finding_names_the_users_line_not_the_tools(tmp_path) -> None:
    from neuron_explorer.rules import recompilation

    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to("neuron")
    step = torch.compile(lambda x: _forward(lin, x), backend="neuron")
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    path = tmp_path / "break.pftrace"
    with neuron_explorer.record(path, level="framework", quiet=True):
        for i in range(3):
            step(torch.randn(4, 8, device="neuron")).backward()
            opt.step()
            opt.zero_grad()
            if i == 1:  # a break in the device's own code, as Dynamo recorded them before
                now = clock.now()
                hub.compile_event(CompileEvent("graph_break", "graph break", now, now, {
                    "reason": "Failed to trace builtin operator: time.perf_counter_ns",
                    "source": f"{_PACKAGE_DIRS[0]}clock.py:217 in _load_free_ns"}))
    trace = load(str(path))
    breaks = trace.compile_summary()["graph_breaks"]
    breaks = breaks[~breaks["source"].str.startswith(_PACKAGE_DIRS)]
    # Dynamo breaks the lambda's graph at its call of `_forward`, then `_forward`'s own
    # graph at the `if`: both at the user's line, for the same reason
    assert len(breaks) and set(breaks["source"]) == {f"{__file__}:{_BRANCH_LINE} in _forward"}
    assert all(r.startswith("Data-dependent branching") for r in breaks["reason"]), breaks
    (finding,) = recompilation.check(trace)
    text = f"{finding.title} {finding.explanation} {finding.recommendation}"
    assert f"{__file__}:{_BRANCH_LINE}" in finding.recommendation
    assert "Data-dependent branching" in finding.explanation
    assert "flow.." not in finding.explanation  # the finding ends the reasons itself
    assert "perf_counter_ns" not in text
    assert not any(d in text for d in _PACKAGE_DIRS), text
