"""Fixtures for the dashboard tests: a folder of synthetic traces and a running server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from neuron_explorer.errors import TraceFormatError
from synthetic_trace import make_trace, synthetic_diff

SYNTH_MAGIC = b"SYNTHETIC-TRACE"


def write_synthetic(path: Path, steps: int = 3, ops: int = 40, seed: int = 0) -> Path:
    path.write_bytes(SYNTH_MAGIC + f" {steps} {ops} {seed}".encode())
    return path


def synthetic_loader(path: str):
    """Loads the tiny description files written above; anything else is a bad trace."""
    data = Path(path).read_bytes()
    if not data.startswith(SYNTH_MAGIC):
        raise TraceFormatError(path, "not a trace this loader knows")
    steps, ops, seed = (int(x) for x in data[len(SYNTH_MAGIC):].split())
    return make_trace(n_steps=steps, ops_per_step=ops, seed=seed)


@pytest.fixture
def trace_folder(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "run_a.json")
    write_synthetic(tmp_path / "run_b.json", steps=4, ops=48, seed=1)
    (tmp_path / "corrupt.json").write_bytes(b"\x00\x01 not a trace")
    return tmp_path


@pytest.fixture
def app_context(trace_folder: Path):
    from neuron_explorer.webapp.app import AppContext
    from neuron_explorer.webapp.trace_store import TraceStore

    store = TraceStore(trace_folder, loader=synthetic_loader, max_upload_bytes=1 << 20)
    yield AppContext(store, differ=synthetic_diff, default_trace="run_a.json")
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
