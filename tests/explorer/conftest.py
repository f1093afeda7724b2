"""Fixtures of the explorer tests: the hand-made scenarios, written once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import neuron_explorer
import scenarios


@pytest.fixture(scope="session")
def traces_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("explorer_traces")


@pytest.fixture(scope="session", params=["pftrace", "json"])
def basic_trace(request: pytest.FixtureRequest, traces_dir: Path) -> neuron_explorer.Trace:
    """The `basic` scenario, loaded from each of our formats."""
    path = scenarios.basic().write(traces_dir, "basic", request.param)
    return neuron_explorer.load(path)


@pytest.fixture(scope="session")
def basic_pf(traces_dir: Path) -> neuron_explorer.Trace:
    return neuron_explorer.load(scenarios.basic().write(traces_dir, "basic_pf"))


@pytest.fixture(scope="session")
def clean_trace(traces_dir: Path) -> neuron_explorer.Trace:
    return neuron_explorer.load(scenarios.clean().write(traces_dir, "clean"))


@pytest.fixture(scope="session")
def load_real(real_traces_dir: Path):
    """Load a real trace once per session (the MTIA one takes seconds)."""
    cache: dict[str, neuron_explorer.Trace] = {}

    def get(name: str) -> neuron_explorer.Trace:
        if name not in cache:
            cache[name] = neuron_explorer.load(real_traces_dir / name)
        return cache[name]

    return get
