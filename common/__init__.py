"""What the backend, the collectors and the explorer all use, below every layer: the
error hierarchy, the trace format (its names, args and Perfetto field numbers), the op
key codec, the op families (which ops are matmuls, convolutions, attention), interval
unions, the cyclic collector's pause for large builds and whether numba is there for the
compiled walks. Nothing here imports another part of the package."""
