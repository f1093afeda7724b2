"""`neuron_explorer.nki`: NKI-style kernels on the simulated NeuronCore.

    import neuron_explorer.nki as nki
    import neuron_explorer.nki.language as nl
    import neuron_explorer.nki.isa as nisa

A subset of AWS's Neuron Kernel Interface, faithful in names and semantics (see
docs/nki.md): kernels run with exact host numerics and are timed instruction by
instruction, each instruction carrying its kernel source line.
"""

from __future__ import annotations

from neuron_explorer.nki import isa, language
from neuron_explorer.nki.errors import NkiError
from neuron_explorer.nki.runner import (
           Benchmark,
           JitKernel,
           LineTime,
           benchmark,
           jit,
           run,
           simulate_kernel,
)
from neuron_explorer.nki.torch_op import as_torch_op

__all__ = ["Benchmark", "JitKernel", "LineTime", "NkiError", "as_torch_op", "benchmark",
           "isa", "jit", "language", "run", "simulate_kernel"]
