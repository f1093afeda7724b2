"""Calling a kernel with `neuron` tensors: one op, one kernel on the device timeline,
outputs back as `neuron` tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from neuron_explorer import nki
from neuron_explorer.backend.events import hub

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "nki"))
import matmul


class Recorder:
    def __init__(self) -> None:
        self.ops, self.kernels = [], []

    def op_launched(self, ev) -> None:
        self.ops.append(ev)

    def kernel_scheduled(self, ev) -> None:
        self.kernels.append(ev)

    def memory_changed(self, ev) -> None:
        pass

    def sync_waited(self, ev) -> None:
        pass

    def compile_event(self, ev) -> None:
        pass


@pytest.fixture
def recorder():
    rec = Recorder()
    hub.subscribe(rec)
    try:
        yield rec
    finally:
        hub.unsubscribe(rec)


def test_a_kernel_called_with_neuron_tensors_is_one_launch(recorder):
    lhsT = torch.randn(256, 128).bfloat16()
    rhs = torch.randn(256, 512).bfloat16()
    a, b = lhsT.to("neuron"), rhs.to("neuron")
    before = (len(recorder.ops), len(recorder.kernels))
    out = matmul.matmul_tiled(a, b)
    assert out.device.type == "neuron" and out.dtype == torch.bfloat16
    new_ops = recorder.ops[before[0]:]
    new_kernels = recorder.kernels[before[1]:]
    assert [op.name for op in new_ops] == ["nki::matmul_tiled"]
    assert len(new_kernels) == 1 and new_kernels[0].op_id == new_ops[0].op_id
    assert new_kernels[0].end_ns > new_kernels[0].start_ns
    expected = (lhsT.float().T @ rhs.float()).bfloat16()
    torch.testing.assert_close(out.cpu(), expected, rtol=2 ** -7, atol=1e-2)


def test_tensors_on_the_cpu_are_refused_with_the_fix():
    with pytest.raises(nki.NkiError, match=r"\.to\('neuron'\)"):
        matmul.matmul_tiled(torch.randn(128, 128), torch.randn(128, 512))


def test_a_kernel_as_a_torch_op_runs_eager_and_inside_compiled_graphs(recorder):
    import warnings

    op = nki.as_torch_op(matmul.matmul_tiled, name="matmul_tiled_test_op")

    def f(a, b):
        return torch.relu(op(a, b)) * 2

    lhsT, rhs = torch.randn(256, 128).bfloat16(), torch.randn(256, 512).bfloat16()
    eager = f(lhsT.to("neuron"), rhs.to("neuron"))
    assert eager.device.type == "neuron" and eager.dtype == torch.bfloat16
    a, b = lhsT.to("neuron"), rhs.to("neuron")
    before = len(recorder.kernels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no host-fallback warning: the op is lowered
        compiled = torch.compile(f, backend="neuron")(a, b)
    assert torch.equal(compiled.cpu(), eager.cpu())
    expected = torch.relu((lhsT.float().T @ rhs.float()).bfloat16()) * 2
    torch.testing.assert_close(eager.cpu(), expected, rtol=2 ** -7, atol=1e-2)
    # one graph kernel holding the NKI kernel's own instructions, not a host round trip
    graphs = [k for k in recorder.kernels[before:] if k.name.startswith("graph_")]
    assert len(graphs) == 1 and not graphs[0].fallback
    from neuron_explorer.backend import devices

    class Spec:
        def __init__(self, t):
            self.shape, self.dtype = tuple(t.shape), "bfloat16"

    alone = nki.benchmark(matmul.matmul_tiled, Spec(lhsT), Spec(rhs),
                          preset=devices.get(0).preset)
    assert graphs[0].engine_busy_ns["tensor"] == alone.engine_busy_ns["tensor"] > 0
    assert graphs[0].model_flops >= 2 * 256 * 128 * 512
