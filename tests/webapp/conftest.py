"""Fixtures for the dashboard tests: a folder of synthetic trace files (written with the
project's Perfetto writer, loaded by the real loader) and a running server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from trace_files import write_synthetic


@pytest.fixture
def trace_folder(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "run_a.pftrace")
    write_synthetic(tmp_path / "run_b.pftrace", steps=4, ops=48, seed=1)
    (tmp_path / "corrupt.json").write_bytes(b"\x00\x01 not a trace")
    return tmp_path


@pytest.fixture
def app_context(trace_folder: Path):
    from neuron_explorer.webapp.app import AppContext
    from neuron_explorer.webapp.trace_store import TraceStore

    store = TraceStore(trace_folder, max_upload_bytes=1 << 20)
    yield AppContext(store, default_trace="run_a.pftrace")
    store.close()


@pytest.fixture
def live_server(app_context):
    from neuron_explorer.webapp.app import create_app
    from neuron_explorer.webapp.server import DashboardServer

    server = DashboardServer(create_app(app_context).server).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def recorded_demo(tmp_path_factory) -> Path:
    """The demo workload recorded once per session with `neuron-explorer record` (a real trace)."""
    from neuron_explorer.webapp.demo_command import record_demo

    return record_demo(tmp_path_factory.mktemp("demo"), train_steps=3)
