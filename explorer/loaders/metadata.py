"""A trace's metadata, merged from its metadata events and checked where analyses read it.

Both loaders merge the JSON objects held by the metadata instants (in file order).
The figures the analyses compute with (peaks, bandwidths, capacities) are checked
here, at load, so that a wrong type is a TraceFormatError naming the key rather
than an error from an analysis later.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.errors import TraceFormatError

# hardware_figures keys read as numbers (peaks.py, the rules, the roofline page)
NUMERIC_FIGURES = ("peak_flops", "hbm_bytes_per_s", "memory_bytes_per_s", "dma_bytes_per_s",
                   "hbm_bytes", "partitions", "dma_engines")
DEVICE_NUMBERS = ("totalGlobalMem",)  # a PyTorch-profiler deviceProperties entry


def merge_json(meta: dict[str, Any], text: Any) -> bool:
    """Merge one metadata event's JSON object into `meta`; False when it is not one."""
    if not isinstance(text, str | bytes):
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not isinstance(value, dict):
        return False
    meta.update(value)
    return True


def merge_metadata(path: str, texts: Iterable[Any], base: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The trace's metadata: `base` (a JSON trace's top-level fields), then each metadata
    event's JSON object in file order, checked (`check`)."""
    meta: dict[str, Any] = dict(base or {})
    for text in texts:
        merge_json(meta, text)
    return check(path, meta)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check(path: str, meta: dict[str, Any]) -> dict[str, Any]:
    """`meta`, once the values analyses read have the types they need."""
    figures = meta.get(tf.META_HARDWARE_FIGURES)
    if figures is not None:
        where = f"metadata '{tf.META_HARDWARE_FIGURES}'"
        if not isinstance(figures, dict):
            raise TraceFormatError(path, f"{where} must be an object")
        for key in NUMERIC_FIGURES:
            if figures.get(key) is not None and not _is_number(figures[key]):
                raise TraceFormatError(path, f"{where}: '{key}' must be a number, not "
                                       f"{figures[key]!r:.40}")
        peaks = figures.get("tensor_peak_flops")
        if peaks is not None and not (isinstance(peaks, dict)
                                      and all(_is_number(v) for v in peaks.values())):
            raise TraceFormatError(path, f"{where}: 'tensor_peak_flops' must map dtypes to "
                                   "numbers")
    props = meta.get("deviceProperties")
    if props is not None:
        if not isinstance(props, list) or not all(isinstance(p, dict) for p in props):
            raise TraceFormatError(path, "'deviceProperties' must be a list of objects, one "
                                   "per device")
        for i, p in enumerate(props):
            for key in DEVICE_NUMBERS:
                if p.get(key) is not None and not _is_number(p[key]):
                    raise TraceFormatError(path, f"'deviceProperties'[{i}]: '{key}' must be a "
                                           "number")
    return meta


def missing_end_mark(path: str, meta: dict[str, Any]) -> str | None:
    """The warning for a recording that declared an end mark and does not have it: the
    process died before closing the trace (None when complete, or not declared)."""
    if not meta.get(tf.META_END_MARK) or meta.get(tf.META_COMPLETE):
        return None
    return (f"{path}: the recording has no end mark: it stopped before closing the trace "
            "(was the recording killed?); the steps it was in are missing or partial")
