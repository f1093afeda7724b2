"""Training features on the neuron device, each compared with the same code on the CPU."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def _steps(model: nn.Module, device: str, make_opt, steps: int = 3, clip: float | None = None):
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen).to(device)
        y = torch.randint(0, 4, (8,), generator=gen).to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
], ids=["sgd", "adam", "adamw-foreach", "adamw-single"])
def test_optimizers_match_cpu(make_opt):
    model = _model()
    cpu_losses, cpu_params = _steps(model, "cpu", make_opt, clip=0.5)
    dev_losses, dev_params = _steps(model, "neuron", make_opt, clip=0.5)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    for a, b in zip(cpu_params, dev_params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_autocast_runs_matmuls_in_bfloat16():
    model = nn.Linear(8, 8).to("neuron")
    x = torch.randn(4, 8, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = model(x)
        assert out.dtype == torch.bfloat16
        loss = out.float().square().mean()
    loss.backward()
    assert model.weight.grad.dtype == torch.float32
    expected = nn.functional.linear(x.cpu().bfloat16(), model.weight.cpu().bfloat16(),
                                    model.bias.cpu().bfloat16())
    assert torch.allclose(out.cpu().float(), expected.float(), atol=1e-2)


def test_dropout_is_reproducible_under_manual_seed():
    x = torch.ones(1000, device="neuron")
    drop = nn.Dropout(0.5)
    torch.manual_seed(3)
    first = drop(x).cpu()
    torch.manual_seed(3)
    again = drop(x).cpu()
    torch.manual_seed(4)
    other = drop(x).cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert 350 < int((first == 0).sum()) < 650
    assert set(first.unique().tolist()) <= {0.0, 2.0}


def test_activation_checkpointing_gives_the_same_gradients():
    model = _model().to("neuron")
    x = torch.randn(8, 16, device="neuron", requires_grad=True)
    model(x).sum().backward()
    plain = [p.grad.cpu().clone() for p in model.parameters()]
    model.zero_grad()
    checkpoint(model, x, use_reentrant=False).sum().backward()
    for a, p in zip(plain, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad.cpu(), atol=1e-6)


def test_state_dict_save_and_load():
    model = _model().to("neuron")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    on_device = torch.load(buffer, weights_only=True)
    assert all(t.device == torch.device("neuron", 0) for t in on_device.values())
    buffer.seek(0)
    on_host = torch.load(buffer, weights_only=True, map_location="cpu")
    assert all(t.device.type == "cpu" for t in on_host.values())
    buffer.seek(0)
    moved = torch.load(buffer, weights_only=True, map_location="neuron:1")
    assert all(t.device == torch.device("neuron", 1) for t in moved.values())
    fresh = _model()
    fresh.load_state_dict(on_host)
    fresh.to("neuron").load_state_dict(on_device)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b.cpu())


def test_deepcopy_of_a_device_model():
    model = _model().to("neuron")
    twin = copy.deepcopy(model)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert b.device == a.device and torch.equal(a.cpu(), b.cpu())
        assert a.data_ptr() != b.data_ptr()


def test_dataloader_with_pin_memory_warns_once_and_loads():
    data = torch.utils.data.TensorDataset(torch.arange(12.0).view(6, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = [b[0].to("neuron") for b in loader]
        second = [b[0].to("neuron") for b in loader]
    pin_warnings = [w for w in caught if "pin_memory" in str(w.message)]
    assert len(pin_warnings) <= 1  # once per process (an earlier test may have seen it)
    assert torch.equal(torch.cat([b.cpu() for b in first]), data.tensors[0])
    assert len(second) == 3
