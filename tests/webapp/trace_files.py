"""Trace files for the dashboard tests: synthetic traces written with the project's
Perfetto writer (see synthetic_trace.py), and the loader the server uses.

A module of its own, not the conftest: test modules import it by this name, which no
other folder's module shares, so what they get does not depend on collection order."""

from __future__ import annotations

from pathlib import Path

from neuron_explorer.webapp.trace_store import default_loader as load_trace
from synthetic_trace import write_trace

__all__ = ["load_trace", "write_synthetic"]


def write_synthetic(path: Path, steps: int = 3, ops: int = 40, seed: int = 0) -> Path:
    """A real trace file of `steps` eager steps at `path`."""
    return write_trace(path, n_steps=steps, ops_per_step=ops, seed=seed)
