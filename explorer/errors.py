"""`neuron_explorer.errors`: the error and warning classes, for user code that catches
them. They are defined in `neuron_explorer.common.errors`, below every layer."""

from neuron_explorer.common.errors import (
    DamagedTraceWarning,
    NeuronExplorerError,
    TraceFormatError,
    TraceFormatWarning,
    TruncatedTraceWarning,
    UnknownTableError,
)

__all__ = ["DamagedTraceWarning", "NeuronExplorerError", "TraceFormatError",
           "TraceFormatWarning", "TruncatedTraceWarning", "UnknownTableError"]
