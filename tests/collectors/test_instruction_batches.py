"""Engine level: instructions written from the simulator's arrays match its Instruction records."""

from __future__ import annotations

import dataclasses

import neuron_explorer
import torch
from neuron_explorer.backend.events import EventSink, KernelRun, hub

from .trace_reading import parse


class KernelCapture(EventSink):
    """A second sink that asks for Instruction records, to compare with."""

    def __init__(self) -> None:
        self.kernels: list[KernelRun] = []

    def kernel_scheduled(self, ev: KernelRun) -> None:
        self.kernels.append(ev)


def _instruction_rows(path) -> list[tuple]:
    trace = parse(path)
    rows = []
    for s in trace.by_category("instruction") + trace.by_category("dma"):
        rows.append((trace.track_name(s.track), s.name, s.ts, s.dur, s.args["kernel_id"],
                     s.args["bytes"], s.args["flops"], s.args["engine"], tuple(s.flow_in)))
    return sorted(rows)


def test_arrays_and_instruction_records_write_the_same_events(tmp_path) -> None:
    capture = KernelCapture()
    hub.subscribe(capture, instructions=True)
    try:
        with neuron_explorer.record(tmp_path / "arrays.pftrace", level="engine", quiet=True):
            x = torch.randn(64, 96, device="neuron")
            w = torch.randn(96, 32, device="neuron")
            torch.relu(x @ w).sum().item()
    finally:
        hub.unsubscribe(capture)
    kernels = [k for k in capture.kernels if k.instructions]
    assert kernels and all(k.kernel is not None for k in kernels)
    # the same kernels again, as hand-built events carrying Instruction records only
    with neuron_explorer.record(tmp_path / "records.pftrace", level="engine", quiet=True):
        for k in kernels:
            hub.kernel_scheduled(dataclasses.replace(k, kernel=None))
    from_arrays = _instruction_rows(tmp_path / "arrays.pftrace")
    from_records = _instruction_rows(tmp_path / "records.pftrace")
    expected = sorted((i.opcode, i.start_ns, i.dur_ns, k.kernel_id, i.bytes, i.flops, i.engine)
                      for k in kernels for i in k.instructions)
    assert sorted(r[1:8] for r in from_arrays) == expected
    assert from_arrays == from_records
    # each kernel's flows end on its first instruction per engine
    assert any(r[-1] for r in from_arrays)
