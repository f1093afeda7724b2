"""Fusion decisions on small aten graphs traced on the CPU (no device needed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from neuron_explorer.backend.compiler.fusion import OpKind, classify, plan_fusion
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def trace(fn, *shapes):
    return make_fx(fn)(*[torch.randn(*s) for s in shapes])


def compute_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and classify(n) is not OpKind.VIEW]


def assert_well_formed(gm, groups):
    """Every compute op is in exactly one group; groups run after what they read."""
    seen = [n for g in groups for n in g.nodes]
    assert sorted(map(str, seen)) == sorted(map(str, compute_nodes(gm)))
    assert len(seen) == len(set(seen))
    position = {n: g.group_id for g in groups for n in g.nodes}
    for group in groups:
        for value in group.inputs:
            if value in position:
                assert position[value] < group.group_id, (group.name, value)


def test_elementwise_chain_is_one_group_with_only_its_ends_in_hbm():
    gm = trace(lambda x, y: torch.exp(torch.relu(x * 2 + y)), (64, 32), (64, 32))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    assert len(groups) == 1
    (group,) = groups
    assert group.kind is OpKind.ELEMENTWISE
    assert [n.op for n in group.inputs] == ["placeholder", "placeholder"]
    assert len(group.outputs) == 1 and group.outputs[0].target is aten.exp.default
    assert group.name == "fused_mul_add_relu_exp"


def test_matmul_takes_bias_activation_and_residual_as_epilogue():
    def mlp(x, w, b, r):
        return F.gelu(x @ w + b) + r

    gm = trace(mlp, (16, 32), (32, 64), (64,), (16, 64))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    assert len(groups) == 1
    group = groups[0]
    assert group.kind is OpKind.MATMUL
    assert group.anchor.target is aten.mm.default
    assert [n.target for n in group.nodes[1:]] == [aten.add.Tensor, aten.gelu.default,
                                                   aten.add.Tensor]
    # Only the final sum leaves the kernel: the matmul result stays on chip.
    assert [n.target for n in group.outputs] == [aten.add.Tensor]
    assert group.outputs[0] is group.nodes[-1]


def test_two_matmuls_never_share_a_kernel():
    gm = trace(lambda x, w1, w2: torch.relu(x @ w1) @ w2, (8, 16), (16, 16), (16, 4))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    assert [g.kind for g in groups] == [OpKind.MATMUL, OpKind.MATMUL]
    assert groups[0].name == "fused_mm_relu"
    # The first kernel's activation is the second's input, so it goes through HBM.
    assert groups[1].inputs[0] is groups[0].outputs[0]


def test_reduction_fuses_with_its_elementwise_producers_and_consumers():
    def softmax_by_hand(x):
        e = torch.exp(x - x.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)

    gm = trace(softmax_by_hand, (32, 128))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    assert len(groups) == 1
    kinds = [classify(n) for n in groups[0].nodes]
    assert kinds.count(OpKind.REDUCTION) == 2 and OpKind.ELEMENTWISE in kinds


def test_value_read_by_two_kernels_is_written_once_and_graph_stays_acyclic():
    # a feeds the matmul and the final add: fusing the add into a's group would
    # make that group both feed and wait for the matmul.
    def f(x, w):
        a = torch.exp(x)
        return a + a @ w

    gm = trace(f, (32, 32), (32, 32))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    assert len(groups) == 2
    exp_group, mm_group = groups
    assert exp_group.name == "exp" and mm_group.name == "fused_mm_add"
    assert exp_group.outputs == exp_group.nodes
    assert exp_group.nodes[0] in mm_group.inputs


def test_views_make_no_kernels_and_are_looked_through():
    def f(x):
        return (x.view(8, 4, 8).transpose(1, 2).reshape(8, 32) * 3).t().contiguous()

    gm = trace(f, (8, 32))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    assert all(classify(n) is not OpKind.VIEW for g in groups for n in g.nodes)
    assert [g.inputs[0].op for g in groups] == ["placeholder"]


def test_opaque_ops_get_their_own_kernel():
    def f(idx, table, x):
        return torch.cat([F.embedding(idx, table) * 2, x], dim=0)

    gm = make_fx(f)(torch.randint(0, 10, (4,)), torch.randn(10, 8), torch.randn(3, 8))
    groups = plan_fusion(gm)
    assert_well_formed(gm, groups)
    names = [g.name for g in groups]
    assert names == ["embedding", "mul", "cat"]
    assert [g.kind for g in groups] == [OpKind.OPAQUE, OpKind.ELEMENTWISE, OpKind.OPAQUE]


def test_transformer_block_training_graphs_fuse_to_far_fewer_kernels():
    block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    graphs = {}

    def capture(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return gm

        return compiler

    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw"))
    torch._dynamo.reset()
    torch.compile(block, backend=backend)(torch.randn(2, 8, 32)).sum().backward()
    assert set(graphs) == {"fw", "bw"}
    for gm in graphs.values():
        groups = plan_fusion(gm)
        assert_well_formed(gm, groups)
        assert len(groups) <= 0.6 * len(compute_nodes(gm))
        assert sum(g.kind is OpKind.MATMUL for g in groups) == sum(
            classify(n) is OpKind.MATMUL for n in compute_nodes(gm)
        )
