"""Backward module slices: nested as the modules are, also with activation checkpointing."""

from __future__ import annotations

import neuron_explorer
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .trace_reading import ParsedTrace, Slice, parse


class _CheckpointedBlock(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + checkpoint(self.inner, x, use_reentrant=self.reentrant)


def _record(path, model: nn.Module, steps: int = 2) -> ParsedTrace:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with neuron_explorer.record(path, level="op", quiet=True):
        for _ in range(steps):
            x = torch.randn(4, 8, device="neuron", requires_grad=True)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return parse(path)


def _module_parent(s: Slice) -> Slice | None:
    parent = s.parent
    while parent is not None and parent.category not in ("module", "backward"):
        parent = parent.parent
    return parent


def _assert_nested_by_path(trace: ParsedTrace) -> None:
    """Every backward slice sits in the backward slice of its parent module."""
    for s in trace.by_category("backward"):
        module = s.args["module"]
        parent = _module_parent(s)
        if "." not in module:
            assert parent is None, f"{module} backward inside {parent.name}"
        else:
            assert parent is not None and parent.category == "backward", module
            assert parent.args["module"] == module.rsplit(".", 1)[0], (module, parent.name)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpoint_recompute_keeps_backward_slices_nested(tmp_path, reentrant) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_CheckpointedBlock(reentrant), _CheckpointedBlock(reentrant),
                          nn.Linear(8, 2)).to("neuron")
    trace = _record(tmp_path / "ckpt.pftrace", model)
    _assert_nested_by_path(trace)
    steps = [0, 1]
    for step in steps:
        tops = [s for s in trace.by_category("backward")
                if s.args["module"] == "model" and s.args["step"] == step]
        assert len(tops) == 1, f"step {step}: {len(tops)} model backward slices"
    # the recomputed forward of each block sits inside that block's backward
    recomputed = [s for s in trace.by_category("module")
                  if s.args["module"] == "model.1.inner" and _module_parent(s) is not None
                  and _module_parent(s).category == "backward"]
    assert len(recomputed) == len(steps)
    for s in recomputed:
        outer = _module_parent(s)
        while outer.args["module"] != "model.1":
            outer = _module_parent(outer)
            assert outer is not None and outer.category == "backward"
    # no op is left outside the slices of the module that ran it
    for op in trace.by_category("op"):
        holder = _module_parent(op)
        if holder is not None and op.args.get("module"):
            assert op.args["module"].startswith(holder.args["module"]), (op.name, holder.name)


def test_gradient_accumulation_adds_grads_inside_the_module_backward(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "accumulate.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        for _ in range(2):
            for _micro in range(3):  # the 2nd and 3rd backward add into existing .grad
                model(torch.randn(4, 8, device="neuron")).sum().backward()
            opt.step()
            opt.zero_grad()
    trace = parse(path)
    _assert_nested_by_path(trace)
    tops = [s for s in trace.by_category("backward") if s.args["module"] == "model"]
    assert len(tops) == 6  # one per backward call
    adds = [op for op in trace.by_category("op") if op.name == "aten::add_"
            and _module_parent(op) is not None and _module_parent(op).category == "backward"]
    assert {op.args["module"] for op in adds} == {"model.0", "model.2"}
    assert len(adds) == 2 * 2 * 2 * 2  # steps x later micro-batches x layers x (weight, bias)
