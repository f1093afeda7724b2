"""What the backend, the collectors and the explorer all use, below every layer: the
error hierarchy, the trace format (its names, args and Perfetto field numbers), the op
key codec, the op families (which ops are matmuls, convolutions, attention) and interval
unions. Nothing here imports another part of the package."""
