"""What each slice is (`kind`), whatever wrote the trace.

Our traces say it with their category (docs/trace-format.md). PyTorch-profiler
(Kineto) traces from any device use their own categories: device kernels are
`kernel` (CUDA, ROCm) or a vendor category on a device process (MTIA's
`mtia_ccp_events`), copies `gpu_memcpy`, runtime calls `<vendor>_runtime` or
`<vendor>_driver`, host ops `cpu_op`, steps `ProfilerStep#N` annotations.
"""

from __future__ import annotations

import re

from neuron_explorer import trace_format as tf

OUR_KINDS = {
    tf.CAT_STEP, tf.CAT_MODULE, tf.CAT_BACKWARD, tf.CAT_OPTIMIZER, tf.CAT_OP, tf.CAT_KERNEL,
    tf.CAT_INSTRUCTION, tf.CAT_DMA, tf.CAT_SYNC, tf.CAT_DATALOADER, tf.CAT_COMPILE,
    tf.CAT_GRAPH_BREAK, tf.CAT_RECOMPILE, tf.CAT_ANNOTATION, tf.CAT_METADATA, tf.CAT_COLLECTIVE,
    tf.CAT_DATALOADER_WORKER,
}
# Kineto categories that only ever run on a device.
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
KINETO_MARKERS = {"cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "ac2g",
                  "user_annotation", "python_function"}
# Older PyTorch profilers (no schemaVersion) wrote these categories; read as today's.
LEGACY_CATEGORIES = {"kernel": "kernel", "runtime": "cuda_runtime", "memcpy": "gpu_memcpy",
                     "memset": "gpu_memset", "operator": "cpu_op"}
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
DEVICE_PROCESS_NAME = re.compile(r"^neuron:(\d+)\b")

# Kinds: step module backward optimizer op kernel memcpy memset instruction dma runtime
# sync device_sync dataloader compile graph_break recompile annotation python metadata other


def our_kind(category: str) -> str:
    """Kind of a slice in one of our traces."""
    return category if category in OUR_KINDS else "other"


def kineto_category(category: str) -> str:
    """A PyTorch-profiler category as today's profiler names it (`Memcpy` -> `gpu_memcpy`)."""
    return LEGACY_CATEGORIES.get(category.lower(), category)


def kineto_kind(category: str, name: str, on_device: bool) -> str:
    """Kind of a slice in a PyTorch-profiler trace."""
    cat = kineto_category(category).lower()
    low = name.lower()
    if cat.endswith(("_runtime", "_driver")):  # API calls, even where a device logs them
        return "sync" if "synchronize" in low else "runtime"
    if cat == "kernel":
        return "kernel"
    if cat == "gpu_memcpy" or (on_device and "dma" in low):
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if on_device:
        if cat == "cuda_sync":
            return "device_sync"
        if cat == "gpu_user_annotation":
            return "annotation"
        return "kernel"  # a vendor's device category (MTIA: mtia_ccp_events)
    if STEP_NAME.match(name):
        return "step"
    if "dataloader" in low:
        return "dataloader"
    if name.startswith("Optimizer."):
        return "optimizer"
    if cat == "cpu_op":
        return "op"
    if cat == "user_annotation":
        return "annotation"
    if cat == "python_function":
        return "module" if name.startswith("nn.Module: ") else "python"
    return "other"
