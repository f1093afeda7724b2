"""Op and kernel slices wait in flat row buffers and are written in batches: what they say
must not depend on how the rows were batched or on the caches behind the batches."""

from __future__ import annotations

import inspect
from pathlib import Path

import neuron_explorer
import torch
from neuron_explorer.backend.events import EventSink, hub
from neuron_explorer.collectors import device_sink

from .trace_reading import parse


def _two_lines(a: torch.Tensor) -> None:
    a.neg()
    a.exp()


def test_each_op_names_its_own_source_line(tmp_path) -> None:
    path = tmp_path / "lines.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        a = torch.ones(4, device="neuron")
        for _ in range(3):  # the same call sites again: answered from the cache
            _two_lines(a)
    first = inspect.getsourcelines(_two_lines)[1]
    expected = {"aten::neg": first + 1, "aten::exp": first + 2}
    ops = [o for o in parse(path).by_category("op") if o.name in expected]
    assert len(ops) == 6
    for op in ops:
        file, _, line = op.args["source"].rpartition(":")
        assert Path(file).name == Path(__file__).name
        assert int(line) == expected[op.name]


def test_rows_keep_their_own_args_when_the_signature_caches_are_cleared(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(device_sink, "_SIGNATURE_LIMIT", 3)  # cleared between batches
    monkeypatch.setattr(device_sink, "_OP_BATCH", 4)
    monkeypatch.setattr(device_sink, "_OP_BUFFER", 4 * len(device_sink._OP_ROW))
    monkeypatch.setattr(device_sink, "_KERNEL_BATCH", 3)
    path = tmp_path / "signatures.pftrace"
    sizes = list(range(1, 12))
    with neuron_explorer.record(path, level="op", quiet=True):
        for n in sizes:
            torch.ones(n, device="neuron").neg()
    trace = parse(path)
    negs = [o for o in trace.by_category("op") if o.name == "aten::neg"]
    assert [o.args["shapes"] for o in negs] == [str([[n]]) for n in sizes]
    kernels = {k.args["op_id"]: k for k in trace.by_category("kernel")}
    for op, n in zip(negs, sizes, strict=True):
        kernel = kernels[op.args["op_id"]]
        assert kernel.args["kernel_id"] == op.args["kernel_id"]
        assert kernel.args["bytes"] == op.args["bytes"] == 2 * 4 * n  # read + write fp32
        assert kernel.flow_in == op.flow_out


class _Counting(EventSink):
    def __init__(self) -> None:
        self.ops = 0

    def op_launched(self, ev) -> None:
        self.ops += 1


def test_the_hub_reaches_one_sink_directly_and_several_in_turn() -> None:
    first, second = _Counting(), _Counting()
    a = torch.ones(2, device="neuron")
    hub.subscribe(first)
    try:
        assert hub.op_launched == first.op_launched  # no fan-out call in between
        a.neg()
        hub.subscribe(second)
        a.neg()
        hub.unsubscribe(first)
        a.neg()
    finally:
        hub.unsubscribe(first)
        hub.unsubscribe(second)
    assert (first.ops, second.ops) == (2, 2)
    assert "op_launched" not in vars(hub) and not hub.active
