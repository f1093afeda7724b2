"""nn.LSTM and nn.GRU on `neuron`: ATen asks an accelerator for fused cells the CPU does
not have (`aten::_thnn_fused_lstm_cell` and its backward: "Could not run ... from the
'CPU' backend"); the backend computes them, forward and backward, as the CPU's layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def _max_error(host: torch.Tensor, device: torch.Tensor) -> float:
    return (host - device.cpu()).abs().max().item()


@pytest.mark.parametrize("layer", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_layers_train_as_on_the_cpu(layer, bias) -> None:
    torch.manual_seed(0)
    host = layer(8, 16, num_layers=2, batch_first=True, bias=bias)
    device = layer(8, 16, num_layers=2, batch_first=True, bias=bias)
    device.load_state_dict(host.state_dict())
    device.to("neuron")
    x = torch.randn(3, 5, 8, requires_grad=True)
    x_device = x.detach().to("neuron").requires_grad_()
    results = []
    for model, inputs in ((host, x), (device, x_device)):
        out, state = model(inputs)
        last = state[0] if layer is nn.LSTM else state
        (out.sum() + last.pow(2).sum()).backward()  # both outputs carry gradient
        results.append((out, last))
    assert _max_error(results[0][0], results[1][0]) < 1e-5
    assert _max_error(results[0][1], results[1][1]) < 1e-5
    assert _max_error(x.grad, x_device.grad) < 1e-5
    for p, q in zip(host.parameters(), device.parameters(), strict=True):
        assert _max_error(p.grad, q.grad) < 1e-5


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_recurrent_cells_step_as_on_the_cpu(cell) -> None:
    torch.manual_seed(1)
    host, device = cell(4, 6), cell(4, 6)
    device.load_state_dict(host.state_dict())
    device.to("neuron")
    x = torch.randn(2, 4)
    out_host, out_device = host(x), device(x.to("neuron"))
    first = (lambda r: r[0]) if cell is nn.LSTMCell else (lambda r: r)
    assert _max_error(first(out_host), first(out_device)) < 1e-6


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_compiled_cells_train_as_on_the_cpu_without_host_fallbacks(cell) -> None:
    """Compiled, the fused cells are decomposed into the ops they are made of: the host,
    which runs a graph's numbers, has no fused cell (a compiled GRUCell stopped with
    NotImplementedError), and each op is costed on the device, none on the host."""
    import warnings

    torch.manual_seed(2)
    host, device = cell(4, 6), cell(4, 6)
    device.load_state_dict(host.state_dict())
    device.to("neuron")
    compiled = torch.compile(device, backend="neuron")
    x = torch.randn(3, 4)
    first = (lambda r: r[0]) if cell is nn.LSTMCell else (lambda r: r)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*has no neuron device lowering")
        out = first(compiled(x.to("neuron")))
        out.pow(2).sum().backward()
    expected = first(host(x))
    expected.pow(2).sum().backward()
    assert _max_error(expected, out) < 1e-6
    for p, q in zip(host.parameters(), device.parameters(), strict=True):
        assert _max_error(p.grad, q.grad) < 1e-5
