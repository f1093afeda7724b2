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
