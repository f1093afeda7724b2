"""Tensors on the neuron device: creation, moves, views, printing, host reads, errors."""

from __future__ import annotations

import copy

import pytest
import torch

NEURON = torch.device("neuron", 0)


def test_creation_and_moves_round_trip():
    x = torch.randn(3, 5)
    y = x.to("neuron")
    assert y.device == NEURON and y.is_neuron and not x.is_neuron
    assert torch.equal(y.cpu(), x)
    assert y.tolist() == x.tolist()
    assert torch.zeros(2, 3, device="neuron").cpu().eq(0).all()
    assert torch.ones(4, device="neuron", dtype=torch.int64).sum().item() == 4
    assert torch.arange(5, device="neuron").tolist() == [0, 1, 2, 3, 4]
    assert torch.full((2,), 7.5, device="neuron").tolist() == [7.5, 7.5]
    assert torch.tensor([1.0, 2.0], device="neuron").device == NEURON
    r = torch.randn(4, 4, device="neuron")
    assert r.device == NEURON and r.shape == (4, 4) and torch.isfinite(r.cpu()).all()
    assert x.neuron().device == NEURON  # generated Tensor.neuron()


def test_arithmetic_matches_cpu():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    na, nb = a.to("neuron"), b.to("neuron")
    assert torch.allclose((na @ nb).cpu(), a @ b)
    assert torch.allclose((na * 2 + 1).relu().sum(dim=1).cpu(), (a * 2 + 1).relu().sum(dim=1))
    assert torch.equal(na.argmax(dim=1).cpu(), a.argmax(dim=1))
    assert torch.allclose(torch.softmax(na, dim=-1).cpu(), torch.softmax(a, dim=-1))
    assert na.to(torch.bfloat16).dtype == torch.bfloat16
    assert torch.equal(na.to(torch.bfloat16).cpu(), a.to(torch.bfloat16))


def test_views_share_device_memory():
    base = torch.zeros(4, 4, device="neuron")
    row = base[1]
    row.fill_(3.0)
    col = base.t()[2]
    col.add_(1.0)
    expected = torch.zeros(4, 4)
    expected[1] = 3.0
    expected[:, 2] += 1.0
    assert torch.equal(base.cpu(), expected)
    assert base.view(16).device == NEURON
    assert torch.equal(base.reshape(2, 8).cpu(), expected.reshape(2, 8))


def test_in_place_metadata_changes_are_seen():
    x = torch.arange(6.0, device="neuron").view(2, 3)
    x.t_()
    assert x.tolist() == torch.arange(6.0).view(2, 3).t().tolist()
    y = torch.arange(4.0, device="neuron")
    y.resize_(8)
    y[4:] = 9.0
    assert y.tolist()[:4] == [0.0, 1.0, 2.0, 3.0] and y.tolist()[4:] == [9.0] * 4


def test_out_variant_resizes_its_output():
    a = torch.randn(3, 3)
    out = torch.empty(0, device="neuron")
    torch.mm(a.to("neuron"), a.to("neuron"), out=out)
    assert out.shape == (3, 3)
    assert torch.allclose(out.cpu(), a @ a)


def test_printing_shows_values_and_device():
    text = repr(torch.tensor([1.5, 2.5], device="neuron"))
    assert text == "tensor([1.5000, 2.5000], device='neuron:0')"
    assert "grad_fn" in repr(torch.ones(2, device="neuron", requires_grad=True) * 2)


def test_item_and_scalars():
    x = torch.tensor([2.0, 3.0], device="neuron")
    assert x.sum().item() == 5.0
    assert (x > 2.5).any().item() is True
    assert x.max().item() == 3.0
    assert float(x[0]) == 2.0


def test_mixed_devices_fail_like_cuda():
    with pytest.raises(RuntimeError) as err:
        torch.ones(2, device="neuron") + torch.ones(2)
    assert str(err.value) == (
        "Expected all tensors to be on the same device, but found at least two devices, "
        "neuron:0 and cpu!")
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        torch.ones(2, device="neuron:0") + torch.ones(2, device="neuron:1")
    # A 0-dim host tensor is a scalar operand, as on CUDA.
    assert (torch.ones(2, device="neuron") + torch.tensor(1.0)).tolist() == [2.0, 2.0]


def test_second_device_keeps_its_tensors():
    x = torch.randn(3).to("neuron:1")
    assert x.device == torch.device("neuron", 1)
    assert (x * 2).device == torch.device("neuron", 1)
    assert torch.allclose((x * 2).cpu(), x.cpu() * 2)
    assert x.to("neuron:0").device == NEURON


def test_deepcopy_clone_and_storage():
    x = torch.randn(5, device="neuron")
    dup = copy.deepcopy(x)
    assert dup.device == NEURON and torch.equal(dup.cpu(), x.cpu())
    dup.add_(1)
    assert not torch.equal(dup.cpu(), x.cpu())
    assert torch.equal(x.clone().cpu(), x.cpu())
    storage = torch.UntypedStorage(16, device="neuron")
    assert storage.device == NEURON and storage.nbytes() == 16
    moved = torch.UntypedStorage(8).neuron()
    assert moved.device == NEURON


def test_module_to_neuron():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    model.to("neuron")
    assert all(p.device == NEURON for p in model.parameters())
    assert model(torch.randn(2, 4, device="neuron")).device == NEURON


def test_conv_and_batchnorm_backward_match_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4))
    twin = copy.deepcopy(model).to("neuron")
    x = torch.randn(2, 3, 8, 8)
    model(x).square().mean().backward()
    twin(x.to("neuron")).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad.cpu(), atol=1e-5)


def test_pickled_tensors_carry_no_host_copies():
    import io
    import pickle

    x = torch.randn(64, 64, device="neuron") * 2
    x.add_(1)  # uses (and caches) the host view of x
    buffer = io.BytesIO()
    torch.save(x, buffer)
    assert len(buffer.getvalue()) < 2 * x.numel() * 4  # one copy of the data, not two
    assert pickle.loads(pickle.dumps(x.cpu())).shape == (64, 64)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=True).cpu(), x.cpu())


def test_in_place_op_on_an_alias_returns_self():
    x = torch.ones(3, device="neuron")
    alias = x.view_as(x)
    result = x.add_(alias)
    assert result is x
    assert x.tolist() == [2.0, 2.0, 2.0]


def test_fake_tensors_print_without_touching_the_device(recorder):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    x = torch.randn(5, 4).to("neuron")
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    symbolic = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(x, symbolic_context=dynamic)
    static = FakeTensorMode().from_tensor(x)
    recorder.ops.clear()
    recorder.syncs.clear()
    assert "neuron:0" in str(symbolic) and ", 4)" in str(symbolic)
    assert str(static) == "FakeTensor(..., device='neuron:0', size=(5, 4))"
    assert recorder.ops == [] and recorder.syncs == []


@pytest.mark.parametrize("new_bytes", [64, 16, 0, 32])
def test_a_storage_resizes_to_any_size_keeping_its_prefix(new_bytes: int) -> None:
    """FSDP2 resizes to 0 and back; growing or shrinking a filled storage failed in torch's
    `_swap_data_ptr_` ("storages must have the same nbytes or one must have 0")."""
    from neuron_explorer.backend import devices

    storage = torch.arange(8, dtype=torch.float32, device="neuron").untyped_storage()
    memory = devices.get(0).memory
    before = memory.in_use
    storage.resize_(new_bytes)
    assert storage.nbytes() == new_bytes
    assert memory.in_use - before == new_bytes - 32  # the old memory is released
    kept = min(new_bytes, 32) // 4
    view = torch.empty(0, dtype=torch.float32, device="neuron").set_(storage, 0, (kept,))
    assert view.cpu().tolist() == list(range(kept))
