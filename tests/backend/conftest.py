"""Fixtures of the device tests: an event recorder and a fresh-interpreter runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from neuron_explorer.backend.events import hub


class Recorder:
    """An event sink that keeps everything it is sent."""

    def __init__(self) -> None:
        self.ops, self.kernels, self.memory, self.syncs, self.compiles = [], [], [], [], []

    def op_launched(self, ev) -> None:
        self.ops.append(ev)

    def kernel_scheduled(self, ev) -> None:
        self.kernels.append(ev)

    def memory_changed(self, ev) -> None:
        self.memory.append(ev)

    def sync_waited(self, ev) -> None:
        self.syncs.append(ev)

    def compile_event(self, ev) -> None:
        self.compiles.append(ev)

    def op_names(self) -> list[str]:
        return [op.name for op in self.ops]


@pytest.fixture
def recorder():
    """Subscribe a Recorder to the backend's events for one test."""
    rec = Recorder()
    hub.subscribe(rec)
    try:
        yield rec
    finally:
        hub.unsubscribe(rec)


@pytest.fixture
def instruction_recorder():
    """A Recorder that also asks for per-instruction records."""
    rec = Recorder()
    hub.subscribe(rec, instructions=True)
    try:
        yield rec
    finally:
        hub.unsubscribe(rec)


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (registration, autoload and env vars start clean)."""
    full_env = dict(os.environ)
    full_env.pop("NEURON_HARDWARE", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False,
                          capture_output=True,
                          text=True, env=full_env, timeout=120)


@pytest.fixture
def fresh_python():
    """`fresh_python(code, env) -> CompletedProcess`: run code in a new interpreter."""
    return run_python


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Small tensors on a shared 2-core machine: OpenMP threads only spin against each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
