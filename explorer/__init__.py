"""Neuron Explorer: profile PyTorch on a simulated Trainium NeuronCore and explore the traces.

The public API is imported lazily: `import torch` autoloads the `neuron` backend,
which lives inside this package, and must not pay for pandas, DuckDB or Dash.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "load": "neuron_explorer.trace",
    "Trace": "neuron_explorer.trace",
    "Run": "neuron_explorer.runs.run",
    "load_run": "neuron_explorer.runs.run",
    "TraceFormatError": "neuron_explorer.common.errors",
    "diff": "neuron_explorer.trace_diff",
    "whatif": "neuron_explorer.what_if.replay",
    "record": "neuron_explorer.collectors.session",
    "step": "neuron_explorer.collectors.session",
    "annotate": "neuron_explorer.collectors.session",
    "phase": "neuron_explorer.collectors.session",
    "request": "neuron_explorer.collectors.session",
}

__all__ = ["Run", "Trace", "TraceFormatError", "__version__", "annotate", "diff", "load",
           "load_run", "phase", "record", "request", "step", "whatif"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time __getattr__ imports
    from neuron_explorer.collectors.session import annotate, phase, record, request, step
    from neuron_explorer.common.errors import TraceFormatError
    from neuron_explorer.runs.run import Run, load_run
    from neuron_explorer.trace import Trace, load
    from neuron_explorer.trace_diff import diff
    from neuron_explorer.what_if.replay import whatif


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neuron_explorer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
