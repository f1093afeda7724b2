"""The runtime API the compile path uses: graph launches, suspended accounting, policies."""

from __future__ import annotations

import torch
from neuron_explorer.backend import devices, runtime
from neuron_explorer.backend.hardware import OpSpec, TensorSpec, lower_op


def _kernels():
    preset = devices.get(0).preset
    mm = lower_op(OpSpec("aten::mm", inputs=(TensorSpec((64, 128)), TensorSpec((128, 64))),
                         outputs=(TensorSpec((64, 64)),)), preset)
    relu = lower_op(OpSpec("aten::relu", inputs=(TensorSpec((64, 64)),),
                           outputs=(TensorSpec((64, 64)),)), preset)
    return [mm, relu]


def test_launch_kernels_is_one_op_with_its_kernels(recorder):
    kernels = _kernels()
    op_id = runtime.launch_kernels(0, kernels, "graph:7", [(64, 128), (128, 64)],
                                   ["float32", "float32"], flops=123, hbm_bytes=456, graph_id=7)
    (op,) = [o for o in recorder.ops if o.op_id == op_id]
    assert op.name == "graph:7" and op.graph_id == 7
    assert op.flops == 123 and op.hbm_bytes == 456
    assert op.input_shapes == ((64, 128), (128, 64))
    runs = [k for k in recorder.kernels if k.op_id == op_id]
    assert [k.kernel_id for k in runs] == list(op.kernel_ids)
    assert [k.name for k in runs] == [k.name for k in kernels]
    assert runs[1].start_ns >= runs[0].end_ns
    overhead = devices.get(0).preset.host_launch_overhead_ns
    assert op.host_end_ns - op.host_start_ns == overhead


def test_suspended_accounting_computes_but_launches_nothing(recorder):
    x = torch.randn(16, 16).to("neuron")
    timeline = devices.get(0).timeline
    before = (timeline.finish_ns, len(recorder.ops), len(recorder.kernels))
    with runtime.device_accounting_suspended():
        y = torch.relu(x @ x) + 1
        value = y.sum().item()
    assert (timeline.finish_ns, len(recorder.ops), len(recorder.kernels)) == before
    expected = torch.relu(x.cpu() @ x.cpu()) + 1
    assert torch.allclose(y.cpu(), expected, atol=1e-5)
    assert abs(value - expected.sum().item()) < 1e-2
    assert runtime.state.accounting  # restored on exit


class QueueingPolicy:
    """Queues eager ops and launches them at sync points, the way a fusing policy would."""

    def __init__(self) -> None:
        self.queue: list[tuple] = []
        self.flushes = 0

    def submit(self, device, key, op_id, host_ns):
        self.queue.append((device, key, op_id, host_ns))
        return runtime.NO_LAUNCH

    def flush(self, host_ns: int) -> int:
        self.flushes += 1
        spent = 0
        for device, key, op_id, _ in self.queue:
            lowered = runtime.lower(device, key)
            if lowered.kernel is not None:
                spent += device.preset.host_launch_overhead_ns
                runtime.schedule(device, lowered.kernel, op_id, host_ns + spent,
                                 lowered.fallback)
        self.queue.clear()
        return spent


def test_eager_policy_is_pluggable_and_flushed_at_sync_points(recorder):
    policy = QueueingPolicy()
    x = torch.randn(8, 8).to("neuron")
    runtime.set_eager_policy(policy)
    try:
        y = torch.exp(x) * 2
        names = [key[0] for _, key, _, _ in policy.queue]
        assert names == ["aten::exp", "aten::mul"]
        spec = runtime.spec_for(policy.queue[0][1])
        assert spec.name == "aten::exp" and spec.inputs[0] == ((8, 8), "float32")
        assert not [k for k in recorder.kernels if k.op_id == policy.queue[0][2]]
        value = y.sum().item()  # a sync point: the policy is flushed first
        assert policy.flushes >= 1 and not policy.queue
        assert abs(value - (torch.exp(x.cpu()) * 2).sum().item()) < 1e-3
    finally:
        runtime.set_eager_policy(None)
    assert isinstance(runtime.state.policy, runtime.ImmediatePolicy)


def test_launch_kernels_launches_queued_eager_work_first(recorder):
    policy = QueueingPolicy()
    x = torch.randn(8, 8).to("neuron")
    runtime.set_eager_policy(policy)
    try:
        torch.exp(x)
        (queued,) = [o for o in recorder.ops if o.name == "aten::exp"]
        op_id = runtime.launch_kernels(0, _kernels(), "graph:8", [(64, 128)], ["float32"],
                                       flops=1, hbm_bytes=1, graph_id=8)
        assert policy.flushes == 1 and not policy.queue
        exp_run, *graph_runs = [k for k in recorder.kernels if k.op_id in (queued.op_id, op_id)]
        assert exp_run.op_id == queued.op_id and {k.op_id for k in graph_runs} == {op_id}
        (graph,) = [o for o in recorder.ops if o.op_id == op_id]
        # The eager launch was paid before the graph's own launch began.
        assert graph.host_start_ns >= exp_run.launch_ns
    finally:
        runtime.set_eager_policy(None)
