"""Shared test setup: the real traces shipped in ../shared and the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = Path(os.environ.get("NEURON_EXPLORER_REAL_TRACES", REPO.parent / "shared" / "real_traces"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_traces_dir() -> Path:
    if not REAL_TRACES.is_dir():
        pytest.fail(f"real traces not found at {REAL_TRACES}; set NEURON_EXPLORER_REAL_TRACES")
    return REAL_TRACES
