"""torch.compile(model) with the default backend (Inductor) on neuron tensors fails as
soon as Dynamo has traced it (Inductor's pre-grad passes, before AOTAutograd traces
forward and backward), with a message that names backend="neuron"."""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import pytest
import torch
from neuron_explorer.backend.compiler.inductor_guard import (
    InductorUnsupportedError,
    refuse_neuron_graph,
)
from neuron_explorer.common.errors import NeuronExplorerError


def test_default_backend_names_the_neuron_backend():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to("neuron")
    x = torch.randn(4, 8).to("neuron")

    def forward(inputs):  # its own code object: no sizes made dynamic by other tests
        return model(inputs)

    with pytest.raises(Exception) as info:
        torch.compile(forward)(x)
    message = str(info.value)
    assert 'backend="neuron"' in message
    assert "inductor" in message
    # The cause is our own error (one clear line), not a KeyError deep in Inductor.
    cause = info.value
    while cause is not None and not isinstance(cause, InductorUnsupportedError):
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, NeuronExplorerError)
    assert "\n" not in str(cause)
    # Raised by the pre-grad check, at the start of AOTAutograd, not at code generation.
    frames = [f.f_code.co_name for f, _ in traceback.walk_tb(cause.__traceback__)]
    assert frames[-1] == "refuse_neuron_graph" and "pre_grad_passes" in frames
    # The model still runs eagerly afterwards, with the same numbers as on the CPU.
    assert torch.allclose(model(x).cpu(), model.cpu()(x.cpu()), atol=1e-6)


def test_device_module_offers_inductor_only_the_guards():
    for name in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
        guard = getattr(torch.neuron, name)
        with pytest.raises(InductorUnsupportedError):
            guard()


def test_the_pre_grad_check_passes_graphs_without_neuron_values():
    def graph(*values):
        return SimpleNamespace(nodes=[SimpleNamespace(meta={"example_value": v})
                                      for v in values])

    cpu = torch.empty(2, device="meta")
    refuse_neuron_graph(graph(cpu, (cpu, 3), None))
    with pytest.raises(InductorUnsupportedError):
        refuse_neuron_graph(graph(cpu, (torch.empty(1, device="neuron"),)))
