"""The fused RNN cells PyTorch asks an accelerator for: `nn.LSTM`, `nn.GRU` and their cells.

On CUDA, XPU and PrivateUse1 devices ATen's recurrent layers call one fused kernel per
time step (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell`) and, in backward, its fused
gradient; the CPU has neither, so the boxed fallback cannot run them on the host. Here
each is the same arithmetic as CUDA's kernels (aten/src/ATen/native/cuda/RNN.cu) in
ordinary ops on the device's tensors: the trace shows the cell as the elementwise ops
it is made of, each costed on the device.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def _gates(input_gates: Tensor, hidden_gates: Tensor, input_bias: Tensor | None,
           hidden_bias: Tensor | None) -> Tensor:
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    return gates


def lstm_cell(input_gates: Tensor, hidden_gates: Tensor, cx: Tensor,
              input_bias: Tensor | None = None,
              hidden_bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(hy, cy, workspace): the workspace keeps the four activated gates for backward."""
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat((i, f, g, o), 1)


def lstm_cell_backward(grad_hy: Tensor | None, grad_cy: Tensor | None, cx: Tensor, cy: Tensor,
                       workspace: Tensor,
                       has_bias: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(grad of the gates, grad of cx, grad of the bias or None)."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    grad_o = torch.zeros_like(cy)
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy
    grad_gates = torch.cat((grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f),
                            grad_c * i * (1 - g * g), grad_o * o * (1 - o)), 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


def gru_cell(input_gates: Tensor, hidden_gates: Tensor, hx: Tensor,
             input_bias: Tensor | None = None,
             hidden_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(hy, workspace): the workspace keeps r, z, n, hx and the hidden part of n."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, i_n = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (i_n + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat((r, z, n, hx, hn), 1)


def gru_cell_backward(grad_hy: Tensor, workspace: Tensor, has_bias: bool
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """(grad of the input gates, of the hidden gates, of hx, of the two biases or None)."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * (1 - r) * r
    grad_input = torch.cat((grad_r, grad_z, grad_n), 1)
    grad_hidden = torch.cat((grad_r, grad_z, grad_n * r), 1)
    if not has_bias:
        return grad_input, grad_hidden, grad_hy * z, None, None
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)


def register(lib: torch.library.Library) -> None:
    """The four kernels, on `lib` (an aten IMPL library), for PrivateUse1."""
    lib.impl("_thnn_fused_lstm_cell", lstm_cell, "PrivateUse1")
    lib.impl("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward, "PrivateUse1")
    lib.impl("_thnn_fused_gru_cell", gru_cell, "PrivateUse1")
    lib.impl("_thnn_fused_gru_cell_backward", gru_cell_backward, "PrivateUse1")


def decompositions() -> dict[object, object]:
    """The four ops as these functions, for compiled graphs: their ops are what the graph's
    kernels run (costed as eager costs them), and the graph's numbers are computed on the
    host, where the CPU has no fused cell (a compiled `nn.GRUCell` stopped with
    NotImplementedError where eager ran)."""
    aten = torch.ops.aten
    return {aten._thnn_fused_lstm_cell.default: lstm_cell,
            aten._thnn_fused_lstm_cell_backward_impl.default: lstm_cell_backward,
            aten._thnn_fused_gru_cell.default: gru_cell,
            aten._thnn_fused_gru_cell_backward.default: gru_cell_backward}
