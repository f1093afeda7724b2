"""A compiled run's trace: one kernel per graph launch, op and kernel tables that
agree with it, and every instruction of a program naming its op, source line and
module."""

from __future__ import annotations

import warnings

import neuron_explorer as ne
import pytest
import torch
from neuron_explorer.workloads.models import GPT, GPTConfig, lm_loss


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1, seq_len=16, d_model=32, vocab_size=64)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randint(0, 64, (2, 16)).to("neuron")
    path = tmp_path_factory.mktemp("compiled") / "gpt.pftrace"
    with warnings.catch_warnings(), ne.record(str(path), level="engine"):
        # the recorder's global module hooks meet torch.compile(module): expected here
        warnings.filterwarnings("ignore", message=".*global hooks.*")
        for _ in range(2):
            loss = lm_loss(compiled(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return ne.load(str(path))


def test_each_graph_launch_is_one_kernel(trace):
    graphs = trace.ops[trace.ops.graph_id >= 0]
    assert len(graphs) == 4  # forward and backward, two steps
    assert (graphs.kernel_count == 1).all()
    kernels = trace.kernels.set_index("op_id")
    phases = set()
    for op in graphs.itertuples():
        kernel = kernels.loc[op.op_id]
        prefix = f"graph_{op.graph_id}_"
        assert kernel["name"].startswith(prefix)
        phases.add(kernel["name"].removeprefix(prefix))
        assert op.device_dur == kernel["dur"]
    assert phases == {"forward", "backward"}
    assert set(trace.modules.module) == {"model"}


def test_program_instructions_name_their_op_source_and_module(trace):
    graph_kernels = set(trace.kernels[trace.kernels.name.str.startswith("graph_")].kernel_id)
    ins = trace.instructions[trace.instructions.kernel_id.isin(graph_kernels)]
    ids = ins.id.to_numpy()
    ops = trace.slice_args.column("ops", ids)
    sources = trace.slice_args.column("source", ids)
    modules = trace.slice_args.column("module", ids)
    assert all(ops) and all(sources)
    assert "aten::bmm" in set(ops) and "aten::_softmax" in set(ops)
    assert {s.rsplit(":", 1)[0].rsplit("/", 1)[-1] for s in sources} == {"models.py"}
    assert "blocks.0.attn" in set(modules) and "blocks.0.mlp.0" in set(modules)
    sections = set(trace.slice_args.column("section", ids))
    assert "flash_attention.bmm" in sections and "fused_addmm_gelu" in sections
    eager = trace.instructions[~trace.instructions.kernel_id.isin(graph_kernels)]
    assert len(eager) and not any(trace.slice_args.column("ops", eager.id.to_numpy()))
