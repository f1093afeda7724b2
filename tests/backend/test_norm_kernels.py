"""Layer and group norm run as the CPU runs them: its numbers bit for bit, under their own names."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _norms():
    w, b = torch.randn(8), torch.randn(8)
    return {
        "native_layer_norm": lambda t, d: F.layer_norm(t, (6, 6)),
        "native_group_norm": lambda t, d: F.group_norm(t, 2, w.to(d), b.to(d)),
    }


@pytest.mark.parametrize("name", ["native_layer_norm", "native_group_norm"])
def test_norms_match_the_cpu_exactly_and_are_one_op(recorder, name) -> None:
    torch.manual_seed(0)
    norm = _norms()[name]
    x = torch.randn(4, 8, 6, 6) * 3 + 1
    on_cpu, on_device = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    recorder.ops.clear()
    out = norm(on_device, "neuron")
    names = [o.name for o in recorder.ops]
    expected = norm(on_cpu, "cpu")
    assert torch.equal(out.detach().cpu(), expected)
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    assert torch.equal(on_device.grad.cpu(), on_cpu.grad)
    # one op, the norm's own, rather than a decomposition into native_batch_norm
    assert f"aten::{name}" in names and "aten::native_batch_norm" not in names
