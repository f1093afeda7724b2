"""Adaptive eager: same numbers and op order as immediate mode, fewer kernels and less
device time; queues flush at sync points and when full; NEURON_EAGER_MODE picks it."""

from __future__ import annotations

import pytest
import torch
from neuron_explorer.backend import devices, runtime
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.compiler import adaptive_mode
from neuron_explorer.backend.compiler.adaptive_eager import MAX_QUEUED_OPS, AdaptivePolicy


@pytest.fixture
def restore_mode():
    yield
    adaptive_mode.set_mode("immediate")


def chain(x: torch.Tensor, length: int) -> torch.Tensor:
    """Elementwise work, each op reading the one before."""
    for i in range(length):
        x = torch.tanh(x * 0.5 + i)
    return x


def run_mlp_steps(mode: str) -> tuple[list[float], int]:
    adaptive_mode.set_mode(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)
    busy_before = devices.get(0).timeline.busy_ns
    losses = []
    for _ in range(3):
        x = torch.randn(16, 32, generator=data).to("neuron")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, devices.get(0).timeline.busy_ns - busy_before


def test_training_numbers_and_op_order_match_immediate_mode(recorder, restore_mode):
    immediate, immediate_busy = run_mlp_steps("immediate")
    immediate_ops = [op.name for op in recorder.ops]
    immediate_kernels = len(recorder.kernels)
    recorder.clear()
    adaptive, adaptive_busy = run_mlp_steps("adaptive")
    assert adaptive == immediate  # numbers are computed exactly as before
    assert [op.name for op in recorder.ops] == immediate_ops
    assert len(recorder.kernels) < 0.8 * immediate_kernels
    assert adaptive_busy < immediate_busy
    fused = [k for k in recorder.kernels if k.name.startswith("adaptive_")]
    assert fused and all(k.op_id in {op.op_id for op in recorder.ops} for k in fused)


def test_a_chain_becomes_one_kernel_at_the_sync_point(recorder, restore_mode):
    x = torch.randn(64, 256).to("neuron")
    chain(x, 2)  # warm the lowering caches
    recorder.clear()
    out = chain(x, 4)
    eager_bytes = sum(k.hbm_bytes for k in recorder.kernels)
    eager_count = len(recorder.kernels)

    adaptive_mode.set_mode("adaptive")
    recorder.clear()
    out_adaptive = chain(x, 4)
    assert recorder.kernels == []  # queued until the host needs the data
    total = out_adaptive.sum().item()  # the sum joins the run; .item() is a sync point
    (fused,) = [k for k in recorder.kernels if k.name.startswith("adaptive_")]
    assert fused.name.startswith("adaptive_mul_add_tanh_mul_add_tanh")
    assert eager_count == 12
    # Each op's input produced earlier in the run is read from SBUF, not HBM.
    assert fused.hbm_bytes < eager_bytes
    assert total == pytest.approx(out.sum().item())


def test_a_full_queue_launches_without_waiting_for_a_sync(recorder, restore_mode):
    policy = AdaptivePolicy()
    runtime.set_eager_policy(policy)
    x = torch.randn(32, 32).to("neuron")
    recorder.clear()
    chain(x, MAX_QUEUED_OPS)  # 3 ops per link: the queue fills twice before any sync
    assert (policy.fused_launches, policy.fused_ops) == (3, 3 * MAX_QUEUED_OPS)
    assert [k.name.startswith("adaptive_") for k in recorder.kernels] == [True] * 3
    torch.neuron.synchronize()  # nothing was left in the queue
    assert len(recorder.kernels) == 3


def test_environment_variable_selects_the_policy(monkeypatch, restore_mode):
    monkeypatch.setenv("NEURON_EAGER_MODE", "adaptive")
    assert adaptive_mode.install_from_environment() == "adaptive"
    assert isinstance(runtime.state.policy, AdaptivePolicy)
    monkeypatch.setenv("NEURON_EAGER_MODE", "lazy")
    with pytest.warns(UserWarning, match="use one of immediate, adaptive"):
        assert adaptive_mode.install_from_environment() == "immediate"
    with pytest.raises(adaptive_mode.UnknownEagerModeError, match="lazy"):
        adaptive_mode.set_mode("lazy")


def test_queued_eager_work_launches_before_a_compiled_graph(recorder, restore_mode):
    compiled = torch.compile(lambda t: torch.tanh(t) * 3, backend="neuron")
    x = torch.randn(16, 16).to("neuron")
    compiled(x)  # compile outside the measured part
    adaptive_mode.set_mode("adaptive")
    recorder.clear()
    y = chain(x, 2)  # queued
    compiled(y)
    kernels_by_op = [k.op_id for k in recorder.kernels]
    graph = next(op for op in recorder.ops if op.graph_id is not None)
    eager_ops = [op.op_id for op in recorder.ops if op.graph_id is None]
    assert kernels_by_op[0] == eager_ops[0]  # the fused eager run comes first
    assert kernels_by_op[-1] == graph.op_id


def test_queued_ops_pay_no_launch_and_each_fused_run_pays_one(recorder, restore_mode):
    overhead = devices.get(0).preset.host_launch_overhead_ns
    x = torch.randn(64, 256).to("neuron")
    adaptive_mode.set_mode("adaptive")
    chain(x, 2).cpu()  # warm the caches
    recorder.clear()
    chain(x, 4).cpu()  # 12 queued ops, then a copy to the host that cannot join
    *queued, copy = recorder.ops
    assert [op.name for op in queued] == ["aten::mul", "aten::add", "aten::tanh"] * 4
    assert all(op.host_end_ns == op.host_start_ns for op in queued)
    fused, copied = recorder.kernels
    assert fused.name.startswith("adaptive_") and fused.op_id == queued[0].op_id
    # The copy issues the fused run's launch, then its own: two launches, in that order.
    assert copy.name == "aten::_to_copy"
    assert copy.host_end_ns - copy.host_start_ns == 2 * overhead
    assert fused.launch_ns == copy.host_start_ns + overhead
    assert copied.launch_ns == copy.host_start_ns + 2 * overhead


def test_a_sync_point_charges_the_fused_launch_before_waiting(recorder, restore_mode):
    overhead = devices.get(0).preset.host_launch_overhead_ns
    x = torch.randn(64, 256).to("neuron")
    adaptive_mode.set_mode("adaptive")
    chain(x, 2)
    torch.neuron.synchronize()
    recorder.clear()
    chain(x, 2)
    before = clock.now()
    torch.neuron.synchronize()
    (fused,) = recorder.kernels
    assert before + overhead <= fused.launch_ns <= clock.now()
