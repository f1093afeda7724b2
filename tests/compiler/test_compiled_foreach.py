"""Foreach ops (an optimizer's step, clipping) in compiled graphs: rewritten as their
per-tensor ops, each parameter's chain is one pass over its memory, its write-backs
stored once, so a compiled step beats its eager foreach kernels."""

from __future__ import annotations

import torch
from neuron_explorer.backend.compiler.foreach_ops import decompositions, expand, per_tensor_name
from neuron_explorer.backend.compiler.fusion import plan_fusion
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def _sgd(p1, p2, g1, g2, b1, b2):
    """SGD with momentum as its foreach step writes it, functional, with the write-backs
    AOTAutograd adds for mutated inputs."""
    bufs = torch._foreach_mul([b1, b2], 0.9)
    bufs = torch._foreach_add(bufs, [g1, g2])
    new = torch._foreach_add([p1, p2], bufs, alpha=-0.01)
    for dst, value in zip([b1, b2, p1, p2], [*bufs, *new], strict=True):
        dst.copy_(value)


def _clip(a, b):
    norms = torch._foreach_norm([a, b])
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(1.0 / (total + 1e-6), max=1.0)
    scaled = torch._foreach_mul([a, b], coef)
    a.copy_(scaled[0])
    b.copy_(scaled[1])


def _traced(fn, foreach_ops: int, *shapes):
    """`fn`'s aten graph as the backend compiles it: its `foreach_ops` expanded."""
    gm = make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes])
    assert expand(gm) == foreach_ops
    assert not any("_foreach_" in str(n.target) for n in gm.graph.nodes)
    return gm


def test_each_parameters_momentum_update_is_one_chain_and_the_chains_run_side_by_side():
    gm = _traced(_sgd, 3, (64, 32), (50,), (64, 32), (50,), (64, 32), (50,))
    (group,) = plan_fusion(gm)
    p1, p2, g1, g2, b1, b2 = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert group.name == "foreach_mul_add_add_copy_copy_x2"
    for chain, reads in zip(group.chains, [{p1, g1, b1}, {p2, g2, b2}], strict=True):
        # each read once (a write-back loads nothing), its two write-backs stored
        assert set(group.inputs_of(chain)) == reads
        assert [n.target for n in chain if n in group.outputs] == [aten.copy_.default] * 2
        assert [n.target for n in chain if n.target is not aten.copy_.default] == [
            aten.mul.Tensor, aten.add.Tensor, aten.add.Tensor]


def test_clipping_scales_each_tensor_in_a_pass_of_its_own():
    gm = _traced(_clip, 2, (64, 32), (50,))
    groups = plan_fusion(gm)
    a, b = [n for n in gm.graph.nodes if n.op == "placeholder"]
    scaling = [g for g in groups if any(n.target is aten.copy_.default for n in g.nodes)]
    # the tensors' sizes differ: a stream of one would run the other's step on each tile
    assert len(scaling) == 2
    assert [{a, b} & set(g.inputs) for g in scaling] == [{a}, {b}]
    assert all(len(g.outputs) >= 1 and g.outputs[-1].target is aten.copy_.default
               for g in scaling)


def _example(argument):
    """A value for a foreach op's argument: two small matrices per list."""
    kind = str(argument.type)
    if kind == "List[Tensor]":
        return [torch.rand(3, 3) + 0.5, torch.rand(3, 3) + 0.5]
    if kind in ("List[number]", "List[Scalar]"):
        return [0.5, 0.25]
    if kind in ("number", "Scalar"):
        return 0.5
    if kind == "Tensor":
        return torch.tensor(0.5)
    if kind == "bool":
        return False
    assert kind.startswith("Optional"), kind
    return None


def test_every_decomposed_overload_computes_what_the_foreach_op_does():
    table = decompositions()
    assert aten._foreach_add.List in table and aten._foreach_norm.Scalar in table
    assert aten._foreach_addcmul.Tensor not in table  # its values sit in a tensor
    for op, decomposed in table.items():
        args = [_example(a) for a in op._schema.arguments if not a.kwarg_only]
        gm = make_fx(lambda *a, op=op: op(*a), decomposition_table={op: decomposed})(*args)
        assert not any("_foreach_" in str(n.target) for n in gm.graph.nodes), op
        for want, got in zip(op(*args), gm(*args), strict=True):
            assert torch.allclose(want, got, rtol=0, atol=0, equal_nan=True), op


def test_a_recorded_foreach_op_names_the_op_it_runs_per_tensor():
    assert per_tensor_name("aten::_foreach_mul_") == "aten::mul_"
    assert per_tensor_name("aten::_foreach_norm") == "aten::linalg_vector_norm"
    assert per_tensor_name("aten::_foreach_powsum") is None
    assert per_tensor_name("aten::mul_") is None


def _step_device_ns(recorder, step) -> tuple[int, int]:
    """(kernels, device ns) of a second call of `step` (the first makes the momentum
    buffers and, compiled, compiles)."""
    step()
    recorder.clear()
    step()
    return len(recorder.kernels), sum(k.end_ns - k.start_ns for k in recorder.kernels)


def _model_and_optimizer(optimizer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 64)).to("neuron")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    return model, optimizer(model.parameters())


def _sgd_momentum(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def test_a_compiled_sgd_step_runs_faster_than_its_eager_foreach_kernels(recorder):
    eager_model, eager_opt = _model_and_optimizer(_sgd_momentum)
    eager_kernels, eager_ns = _step_device_ns(recorder, eager_opt.step)
    model, opt = _model_and_optimizer(_sgd_momentum)
    graph_kernels, graph_ns = _step_device_ns(recorder, torch.compile(opt.step, backend="neuron"))

    assert eager_kernels == 3  # the momentum's multiply and add, the parameters' add
    assert graph_kernels == 1
    # each parameter read with its gradient and buffer once, two write-backs: 5 passes
    # over its memory where the foreach kernels make 8
    assert graph_ns < 0.8 * eager_ns, (graph_ns, eager_ns)
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(p.detach().cpu(), q.detach().cpu())


def test_a_compiled_adamw_step_over_many_small_parameters_beats_its_foreach_kernels(
        recorder):
    """Thirty parameters, most a few hundred elements (a small transformer's norms and
    biases): compiled, AdamW computes its bias corrections per parameter on the device,
    a chain of scalar ops each. Each parameter's chains streams of their own, the
    program took 0.64 of the foreach kernels' time (a 2-layer GPT's 1.15); side by side,
    as the foreach kernels run every tensor, 0.35."""
    def model_and_optimizer():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(64, 2, 128, dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 2).to("neuron")
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    _, eager_opt = model_and_optimizer()
    _, eager_ns = _step_device_ns(recorder, eager_opt.step)
    model, opt = model_and_optimizer()
    assert len(list(model.parameters())) >= 24
    compiled = torch.compile(opt.step, backend="neuron")
    _, graph_ns = _step_device_ns(recorder, compiled)
    assert graph_ns < 0.5 * eager_ns, (graph_ns, eager_ns)
