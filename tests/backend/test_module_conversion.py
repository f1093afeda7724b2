"""`Module.to("neuron")` and back keep each parameter the same object, as on a built-in device."""

from __future__ import annotations

import copy

import torch
from torch import nn


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(12, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 12, bias=False)
        self.head.weight = self.tok.weight  # weight tying

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.tok(idx))))


def _train(model: nn.Module, device: str) -> list[float]:
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        idx = torch.randint(0, 12, (4, 5), generator=gen).to(device)
        loss = nn.functional.cross_entropy(model(idx).reshape(-1, 12), idx.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_tied_weights_stay_tied_and_train_as_on_cpu() -> None:
    torch.manual_seed(0)
    model = _TiedLM()
    moved = copy.deepcopy(model).to("neuron")
    assert moved.head.weight is moved.tok.weight
    assert len(list(moved.parameters())) == len(list(model.parameters()))
    assert _train(model, "neuron") == _train(model, "cpu")


def test_an_optimizer_built_before_the_move_updates_the_moved_model() -> None:
    model = nn.Linear(3, 2)
    weight = model.weight
    weight.no_decay = True  # the user's own attribute on a parameter
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("neuron")
    assert model.weight is weight and weight.device.type == "neuron" and weight.no_decay
    before = weight.detach().cpu().clone()
    model(torch.ones(4, 3, device="neuron")).sum().backward()
    opt.step()
    assert not torch.equal(before, model.weight.detach().cpu())
    model.cpu()
    assert model.weight is weight and weight.device.type == "cpu"
    assert weight.grad is not None and weight.grad.device.type == "cpu"


def test_recurrent_modules_still_run_after_the_move() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    expected, _ = lstm(x)
    moved = nn.Sequential(lstm).to("neuron")  # RNNBase._apply caches its flat weights
    out, _ = moved[0](x.to("neuron"))
    assert torch.allclose(out.cpu(), expected, atol=1e-6)
