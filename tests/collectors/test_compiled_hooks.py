"""Recording a compiled model changes nothing Dynamo does: the recorder's hooks are not
compiled as frames of their own, so they add no recompiles and no compile sources."""

from __future__ import annotations

import neuron_explorer
import pytest
import torch
from torch import nn

from .trace_reading import parse


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inner(x)))


@pytest.mark.filterwarnings("ignore:Using `torch.compile:UserWarning")
def test_a_grad_mode_switch_recompiles_once_and_at_the_users_line(tmp_path) -> None:
    torch.manual_seed(0)
    model = _Net().to("neuron")
    compiled = torch.compile(model, backend="neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "compiled.pftrace"
    with neuron_explorer.record(path, level="framework", quiet=True):
        for _ in range(2):
            for _ in range(2):
                compiled(torch.randn(4, 8, device="neuron")).sum().backward()
                opt.step()
                opt.zero_grad()
            with torch.no_grad():  # evaluation between epochs: one more graph, once
                compiled(torch.randn(4, 8, device="neuron"))
    trace = parse(path)
    recompiles = [i for i in trace.instants if i.category == "recompile"]
    assert len(recompiles) == 1, [r.args.get("source") for r in recompiles]
    assert recompiles[0].args["source"].startswith(f"{__file__}:")
    sources = {s.args.get("source", "") for s in trace.by_category("compile")}
    assert not any("framework_hooks" in src for src in sources), sources
    # the hooks still record the compiled model's calls
    assert sum(1 for m in trace.by_category("module") if m.args["module"] == "model") == 6
