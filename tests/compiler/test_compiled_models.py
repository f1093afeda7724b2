"""torch.compile(backend="neuron") on small models: numbers equal to eager, one launch
per graph with fused kernels, inference and training. Each model compiles once."""

from __future__ import annotations

import copy

import pytest
import torch
from neuron_explorer.backend.events import hub
from neuron_explorer.workloads.models import Block, GPTConfig
from torch import nn
from torch.nn import functional as F

from tests.compiler.conftest import Recorder

ATOL, RTOL = 1e-5, 1e-4


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.detach().cpu(), b.detach().cpu(), atol=ATOL, rtol=RTOL)


class TrainPair:
    """The same model twice on neuron: one run eagerly, one through a compiled step."""

    def __init__(self, model: nn.Module, loss_fn, lr: float = 0.05) -> None:
        self.eager = copy.deepcopy(model).to("neuron")
        self.compiled_model = copy.deepcopy(model).to("neuron")
        self.loss_fn = loss_fn
        self.opt_eager = torch.optim.SGD(self.eager.parameters(), lr=lr)
        self.opt_compiled = torch.optim.SGD(self.compiled_model.parameters(), lr=lr)
        compiled_model = self.compiled_model

        def step(x, y):
            return loss_fn(compiled_model(x), y)

        self.compiled_step = torch.compile(step, backend="neuron")

    def train_step(self, x, y) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = x.to("neuron"), y.to("neuron")
        loss_e = self.loss_fn(self.eager(x), y)
        self.opt_eager.zero_grad()
        loss_e.backward()
        self.opt_eager.step()
        loss_c = self.compiled_step(x, y)
        self.opt_compiled.zero_grad()
        loss_c.backward()
        self.opt_compiled.step()
        return loss_e, loss_c

    def params_match(self) -> bool:
        pairs = zip(self.eager.state_dict().values(),
                    self.compiled_model.state_dict().values(), strict=True)
        return all(close(a, b) for a, b in pairs)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def block() -> nn.Module:
    torch.manual_seed(0)
    return Block(GPTConfig(vocab_size=16, seq_len=8, d_model=32, n_heads=2, n_layers=1))


@pytest.fixture(scope="module")
def mlp_pair():
    return TrainPair(mlp(), F.mse_loss)


@pytest.fixture(scope="module")
def block_pair():
    return TrainPair(block(), lambda out, y: (out - y).pow(2).mean())


def test_mlp_training_matches_eager_with_one_launch_per_graph(mlp_pair, recorder):
    torch.manual_seed(1)
    for step in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        recorder.clear()
        loss_e, loss_c = mlp_pair.train_step(x, y)
        assert close(loss_e, loss_c), (step, loss_e.item(), loss_c.item())
        launches = recorder.graph_launches()
        # The forward graph and the backward graph, each launched once per step.
        assert len(launches) == 2, [op.name for op in launches]
        assert all(op.name == f"graph:{op.graph_id}" for op in launches)
        assert all(op.kernel_ids for op in launches)
        launched_kernels = {k.kernel_id: k for k in recorder.kernels}
        for op in launches:
            assert all(launched_kernels[k].op_id == op.op_id for k in op.kernel_ids)
    assert mlp_pair.params_match()


def test_mlp_forward_keeps_bias_and_gelu_in_the_matmul_kernel(mlp_pair, recorder):
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    programs = Recorder()  # also sent the kernels' schedules and sections
    hub.subscribe(programs, instruction_arrays=True)
    try:
        mlp_pair.train_step(x, y)
    finally:
        hub.unsubscribe(programs)
    forward = recorder.graph_launches()[0]
    (kernel,) = [k for k in programs.kernels if k.kernel_id in forward.kernel_ids]
    assert kernel.name == f"graph_{forward.graph_id}_forward"  # one program per graph
    names = [s.name for s in kernel.kernel.sections]
    # Two matmuls and the loss: the bias and the activation ride on the first matmul.
    assert names[0] == "fused_addmm_gelu", names
    assert len(names) == 3 and names[1].startswith("addmm") and "mse_loss" in names[2]


def test_compile_spans_describe_each_graph(recorder):
    model = mlp().to("neuron")

    def own_step(x, y):  # a code object of its own: Dynamo compiles it afresh
        return F.mse_loss(model(x), y)

    torch.compile(own_step, backend="neuron")(torch.randn(8, 16).to("neuron"),
                                              torch.randn(8, 4).to("neuron")).backward()
    spans = recorder.compiles_of("neuron_compile")
    assert [ev.args["phase"] for ev in spans] == ["forward", "backward"]
    for ev in spans:
        assert ev.end_ns > ev.start_ns
        assert ev.args["op_count"] > ev.args["kernel_count"] > 0
        assert len(ev.args["kernels"]) == ev.args["kernel_count"]
    launches = recorder.graph_launches()
    assert [op.graph_id for op in launches] == [ev.args["graph_id"] for ev in spans]
    kinds = {ev.kind for ev in recorder.compiles}
    assert {"dynamo", "aot_autograd", "neuron_compile"} <= kinds
    aot = recorder.compiles_of("aot_autograd")[0]
    forward = spans[0]
    assert aot.start_ns <= forward.start_ns and forward.end_ns <= aot.end_ns


def test_transformer_block_training_matches_eager(block_pair, recorder):
    torch.manual_seed(2)
    for step in range(2):
        x, y = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
        recorder.clear()
        loss_e, loss_c = block_pair.train_step(x, y)
        assert close(loss_e, loss_c), (step, loss_e.item(), loss_c.item())
        launches = recorder.graph_launches()
        assert len(launches) == 2
        compiled_kernels = sum(len(op.kernel_ids) for op in launches)
        eager_ops = [op for op in recorder.ops if op.graph_id is None]
        assert compiled_kernels > 0 and len(launches) < len(eager_ops)
    assert block_pair.params_match()


def test_convnet_inference_and_training_with_batchnorm_state(recorder):
    model = convnet()
    x = torch.randn(2, 3, 6, 6)

    eval_eager = copy.deepcopy(model).eval().to("neuron")
    eval_compiled = torch.compile(copy.deepcopy(model).eval().to("neuron"), backend="neuron")
    with torch.no_grad():
        ref = eval_eager(x.to("neuron"))
        recorder.clear()
        out = eval_compiled(x.to("neuron"))
    assert close(ref, out)
    assert [ev.args["phase"] for ev in recorder.compiles_of("neuron_compile")] == ["inference"]
    assert len(recorder.graph_launches()) == 1

    pair = TrainPair(model, F.cross_entropy)
    target = torch.tensor([1, 3])
    loss_e, loss_c = pair.train_step(x, target)
    assert close(loss_e, loss_c)
    # BatchNorm's running statistics are updated in place by the compiled graph too.
    assert pair.params_match()
    bn = pair.compiled_model[1]
    assert int(bn.num_batches_tracked.cpu()) == 1


def test_compiled_optimizer_step_is_one_launch_and_matches_eager(recorder):
    eager_model, compiled_model = (copy.deepcopy(mlp()).to("neuron") for _ in range(2))
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    compiled_opt = torch.optim.AdamW(compiled_model.parameters(), lr=1e-2)
    compiled_step = torch.compile(compiled_opt.step, backend="neuron")
    for step in range(3):
        x = torch.randn(8, 16).to("neuron")
        for model, opt in ((eager_model, eager_opt), (compiled_model, compiled_opt)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
        eager_opt.step()
        recorder.clear()
        compiled_step()
        if step > 0:  # the first call also creates the optimizer state, eagerly
            # Parameters and state are updated in place by the graph: one launch.
            assert [op.name.startswith("graph:") for op in recorder.ops if op.kernel_ids] == [
                True]
    for a, b in zip(eager_model.parameters(), compiled_model.parameters(), strict=True):
        assert close(a, b)
