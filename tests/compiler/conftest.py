"""Fixtures of the compile-path tests: an event recorder subscribed to the hub."""

from __future__ import annotations

import pytest
from neuron_explorer.backend.events import EventSink, hub


class Recorder(EventSink):
    """An event sink that keeps what it is sent."""

    def __init__(self) -> None:
        self.ops, self.kernels, self.compiles = [], [], []

    def op_launched(self, ev) -> None:
        self.ops.append(ev)

    def kernel_scheduled(self, ev) -> None:
        self.kernels.append(ev)

    def compile_event(self, ev) -> None:
        self.compiles.append(ev)

    def clear(self) -> None:
        self.ops.clear()
        self.kernels.clear()
        self.compiles.clear()

    def graph_launches(self) -> list:
        return [op for op in self.ops if op.graph_id is not None]

    def compiles_of(self, kind: str) -> list:
        return [ev for ev in self.compiles if ev.kind == kind]


@pytest.fixture(scope="module")
def module_recorder():
    rec = Recorder()
    hub.subscribe(rec)
    yield rec
    hub.unsubscribe(rec)


@pytest.fixture
def recorder(module_recorder):
    module_recorder.clear()
    return module_recorder
