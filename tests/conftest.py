"""Shared test setup: the real traces kept in tests/data and the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The suite loads thousands of throw-away traces: it runs without the trace cache (and
# never writes into the user's), except the tests of the cache, which turn it on.
os.environ.setdefault("NEURON_EXPLORER_CACHE", "off")

REPO = Path(__file__).resolve().parents[1]
# Real PyTorch-profiler traces from other tools, kept in the repository (origin and license
# in their README), so a clone needs nothing beside it.
REAL_TRACES = Path(__file__).resolve().parent / "data" / "real_traces"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_traces_dir() -> Path:
    return REAL_TRACES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the files holding `slow` tests run first (each file whole, in
    collection order otherwise): the long files start at once and the many short ones fill
    the workers in at the end, instead of one long file running alone last."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort
