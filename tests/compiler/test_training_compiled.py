"""train() with compiled models: a model wrapped by torch.compile, and compile=True;
both give the eager CPU loss curve and run as compiled graphs on neuron."""

from __future__ import annotations

import copy

import torch
from neuron_explorer.workloads.models import GPT, GPTConfig
from neuron_explorer.workloads.training import make_model, train

STEPS = 3
TINY = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=2, n_layers=1)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b, strict=True))


def test_train_takes_a_torch_compiled_transformer(recorder):
    torch.manual_seed(0)
    model = GPT(TINY)
    reference = train(copy.deepcopy(model), "cpu", STEPS, batch_size=2)
    compiled = torch.compile(model, backend="neuron")
    losses = train(compiled, "neuron", STEPS, batch_size=2)
    assert _close(reference, losses), (reference, losses)
    assert next(model.parameters()).device.type == "neuron"
    assert recorder.graph_launches()  # the forward ran as compiled graphs


def test_train_compiles_the_loss_step_when_asked(recorder):
    reference = train(make_model("mlp"), "cpu", STEPS, batch_size=8)
    recorder.clear()
    losses = train(make_model("mlp"), "neuron", STEPS, batch_size=8, compile=True)
    assert _close(reference, losses), (reference, losses)
    graphs = {op.graph_id for op in recorder.graph_launches()}
    assert len(graphs) == 2  # the loss step's forward and backward graphs
    assert len(recorder.graph_launches()) == 2 * STEPS
