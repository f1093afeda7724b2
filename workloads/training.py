"""Training loops for the reference models: AdamW, a fixed seed, synthetic data.

The data is generated deterministically on the CPU and then moved to the device, so
the same call gives the same loss curve on "cpu" and "neuron". `train` takes a plain
model or one already wrapped by `torch.compile`, and can compile the loss step itself.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from neuron_explorer.workloads.models import GPT, MLP, MLP_BATCH, MLP_CLASSES, MLP_WIDTH, lm_loss
from torch import nn
from torch.nn import functional as F

SEED = 0


def mlp_batches(steps: int, batch: int = MLP_BATCH, width: int = MLP_WIDTH,
                classes: int = MLP_CLASSES, seed: int = SEED) -> list[tuple[torch.Tensor, ...]]:
    """Synthetic classification batches: inputs (batch, width) and integer labels."""
    gen = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(batch, width, generator=gen),
             torch.randint(0, classes, (batch,), generator=gen)) for _ in range(steps)]


def token_batches(steps: int, batch: int, seq_len: int, vocab: int,
                  seed: int = SEED) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic language-model batches: tokens and the same sequence shifted by one."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        stream = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen)
        out.append((stream[:, :-1].contiguous(), stream[:, 1:].contiguous()))
    return out


def _loss_for(model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if isinstance(model, GPT):
        return lm_loss
    return F.cross_entropy


def _batches_for(model: nn.Module, steps: int, batch_size: int | None):
    if isinstance(model, GPT):
        cfg = model.cfg
        return token_batches(steps, batch_size or 8, cfg.seq_len, cfg.vocab_size)
    width = model.fc1.in_features if isinstance(model, MLP) else MLP_WIDTH
    return mlp_batches(steps, batch_size or MLP_BATCH, width)


def compile_backend_for(device: str | torch.device) -> str:
    """The torch.compile backend for a device: "neuron" for neuron, Inductor elsewhere."""
    return "neuron" if torch.device(device).type == "neuron" else "inductor"


def train(model: nn.Module, device: str | torch.device, steps: int, *, lr: float = 1e-3,
          batch_size: int | None = None, foreach: bool | None = None,
          on_step: Callable[[int], AbstractContextManager | None] | None = None,
          compile: bool = False) -> list[float]:
    """Train `model` on `device` for `steps` AdamW steps; return the loss of each step.

    The model is moved to `device` in place; it may be a `torch.compile`d module (its
    forward runs compiled, the loss eagerly). `compile=True` compiles the whole loss
    step (forward and loss) with `compile_backend_for(device)`. `on_step(step)` may
    return a context manager that wraps the step (the collectors use it to mark steps).
    """
    module = getattr(model, "_orig_mod", model)  # the model inside a torch.compile wrapper
    module.to(device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, foreach=foreach)
    loss_fn = _loss_for(module)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(model(x), y)

    step_loss = torch.compile(loss_of, backend=compile_backend_for(device)) if compile \
        else loss_of
    losses = []
    for step, (inputs, targets) in enumerate(_batches_for(module, steps, batch_size)):
        scope = on_step(step) if on_step is not None else None
        if scope is not None:
            scope.__enter__()
        try:
            x, y = inputs.to(device), targets.to(device)
            loss = step_loss(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        finally:
            if scope is not None:
                scope.__exit__(None, None, None)
    return losses


def make_model(name: str, seed: int = SEED) -> nn.Module:
    """A freshly initialised reference model ("mlp" or "gpt"), the same for a given seed."""
    torch.manual_seed(seed)
    if name == "mlp":
        return MLP()
    if name == "gpt":
        return GPT()
    raise ValueError(f"unknown workload {name!r}: use 'mlp' or 'gpt'")
