"""PyTorch-profiler (Kineto) traces in the explorer's own terms.

The one module that knows Kineto's vocabulary. Declared tables map it onto ours, as
Holistic Trace Analysis's arg config maps trace args onto its columns:

- which kind each slice is, from its category (and, for a few, its name);
- which Kineto arg holds each of our args (`ARG_SOURCES`): the loader adds our args
  beside Kineto's, which stay as they were written;
- what the trace's op slices are (`HOST_OPS` in the metadata).

Tables, analyses and rules then read a Kineto trace as they read ours, and never ask where
a trace came from (docs/trace-format.md lists the mapping).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
from neuron_explorer.common import trace_format as tf
from neuron_explorer.loaders.args import KIND_FLOAT, KIND_INT, KIND_OTHER, ArgsBuilder, DictArgs

# Older PyTorch profilers (no schemaVersion) wrote these categories; read as today's.
LEGACY_CATEGORIES = {"kernel": "kernel", "runtime": "cuda_runtime", "memcpy": "gpu_memcpy",
                     "memset": "gpu_memset", "operator": "cpu_op"}
# Categories that only ever run on a device.
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
# Categories that say a trace is Kineto's.
KINETO_MARKERS = {"cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "ac2g",
                  "user_annotation", "python_function"}

# Kind of a category (today's name, lower case). API calls (`<vendor>_runtime`,
# `<vendor>_driver`) are `runtime`, or `sync` for `...Synchronize`, even where a device
# process logs them (MTIA).
CALL_SUFFIXES = ("_runtime", "_driver")
KINDS_ANYWHERE = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# On a device, any other category is a vendor's kernel (MTIA's `mtia_ccp_events`), and an
# event named like `dma_request` a copy.
KINDS_ON_DEVICE = {"cuda_sync": "device_sync", "gpu_user_annotation": "annotation"}
DEVICE_COPY_NAME = re.compile("dma", re.IGNORECASE)
# On the host, a name says what a slice is before its category does.
HOST_NAME_KINDS = ((re.compile(r"^ProfilerStep#\d+$"), "step"),
                   (re.compile("dataloader", re.IGNORECASE), "dataloader"),
                   (re.compile(r"^Optimizer\."), "optimizer"))
MODULE_PREFIX = "nn.Module: "  # python_function slices of module forwards
KINDS_ON_HOST = {"cpu_op": "op", "user_annotation": "annotation", "python_function": "python"}

OPS = ("op",)
DEVICE_WORK = ("kernel", "memcpy", "memset")
CALLS = ("runtime", "sync")
# Our arg <- the Kineto arg that holds it, on slices of these kinds. `flops`, `bytes` and
# `device` are named alike in both. An op's `op_id` is its `External id` (its slice id
# where it has none that is a count).
ARG_SOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (tf.ARG_OP_ID, "External id", OPS),
    (tf.ARG_SHAPES, "Input Dims", OPS),
    (tf.ARG_DTYPES, "Input type", OPS),
    # a kernel and the runtime call that launched it share a correlation id
    (tf.ARG_KERNEL_ID, "correlation", DEVICE_WORK + CALLS),
    (tf.ARG_COLLECTIVE, "Collective name", DEVICE_WORK),
    (tf.ARG_GROUP, "Process Group Ranks", DEVICE_WORK),
    (tf.ARG_SEQ, "Seq", DEVICE_WORK),
)
# Kineto's cpu_ops are framework ops on any device, the host's included: one that launched
# no device work ran on the host (ours are all ops dispatched to the device).
HOST_OPS = {tf.META_HOST_OPS: True}


def kineto_category(category: str) -> str:
    """A PyTorch-profiler category as today's profiler names it (`Memcpy` -> `gpu_memcpy`)."""
    return LEGACY_CATEGORIES.get(category.lower(), category)


def is_kineto(doc: Any, categories: set[str]) -> bool:
    """Whether a Chrome-trace JSON document was written by the PyTorch profiler."""
    if isinstance(doc, dict) and ("schemaVersion" in doc or "deviceProperties" in doc):
        return True
    named = {kineto_category(c) for c in categories}  # older profilers: Kernel, Operator...
    return bool(named & KINETO_MARKERS) and tf.CAT_METADATA not in categories


def kineto_kind(category: str, name: str, on_device: bool) -> str:
    """Kind of a slice in a PyTorch-profiler trace."""
    cat = kineto_category(category).lower()
    if cat.endswith(CALL_SUFFIXES):
        return "sync" if "synchronize" in name.lower() else "runtime"
    kind = KINDS_ANYWHERE.get(cat)
    if kind == "kernel":
        return kind
    if on_device and DEVICE_COPY_NAME.search(name):
        return "memcpy"
    if kind is not None:
        return kind
    if on_device:
        return KINDS_ON_DEVICE.get(cat, "kernel")
    for pattern, named in HOST_NAME_KINDS:
        if pattern.search(name):
            return named
    if cat == "python_function" and name.startswith(MODULE_PREFIX):
        return "module"
    return KINDS_ON_HOST.get(cat, "other")


def _count_or(value: Any, default: int) -> int:
    """`value` read as the tables read a count (`SliceArgs.numbers`), else `default`."""
    count = int(DictArgs([{"v": value}]).numbers("v", np.zeros(1, np.int64), default=-1)[0])
    return count if count >= 0 else default


Rows = list[tuple[np.ndarray, ...]]


def our_args(kind_codes: np.ndarray, kinds: list[str]) -> Callable[[ArgsBuilder, Rows], Rows]:
    """What adds our args beside Kineto's in `ArgsBuilder.build`, as `ARG_SOURCES` says
    (`kinds[kind_codes[i]]`: slice i's kind): a row of ours for each slice of the named
    kinds that holds the Kineto key (not null), and an op id for every op (its External id
    read as a count, else its slice id). One of ours the trace held already is replaced."""
    def of_kinds(wanted: tuple[str, ...]) -> np.ndarray:
        return np.isin(kind_codes, [kinds.index(k) for k in wanted if k in kinds])

    def derive(builder: ArgsBuilder, parts: Rows) -> Rows:
        held = {builder.keys[ours] for ours, _, _ in ARG_SOURCES if ours in builder.keys}
        copies = [(builder.key_code(ours), builder.keys.get(theirs, -1),
                   of_kinds(on_kinds)) for ours, theirs, on_kinds in ARG_SOURCES
                  if ours != tf.ARG_OP_ID]
        is_op = of_kinds(OPS)
        op_ids = np.flatnonzero(is_op)
        op_values = op_ids.copy()
        external, op_code = builder.keys.get("External id", -1), builder.key_code(tf.ARG_OP_ID)
        out: Rows = []
        for part in parts:
            sid, key, kind, ival, fval, scode = part
            has_value = ~((kind == KIND_OTHER) & (scode < 0))  # a JSON null is no value
            replaced = (key == op_code) & is_op[sid] if op_code in held else None
            for mine, theirs, target in copies:
                hit = np.flatnonzero((key == theirs) & target[sid] & has_value)
                if not len(hit):
                    continue
                out.append((sid[hit], np.full(len(hit), mine, np.int32), kind[hit], ival[hit],
                            fval[hit], scode[hit]))
                if mine in held:
                    mask = (key == mine) & np.isin(sid, sid[hit])
                    replaced = mask if replaced is None else replaced | mask
            _read_op_ids(builder, part, external, is_op, op_ids, op_values)
            out.append(part if replaced is None else tuple(c[~replaced] for c in part))
        n = len(op_ids)
        out.append((op_ids, np.full(n, op_code, np.int32), np.full(n, KIND_INT, np.int8),
                    op_values, np.zeros(n), np.full(n, -1, np.int64)))
        return out
    return derive


def _read_op_ids(builder: ArgsBuilder, part: tuple[np.ndarray, ...], external: int,
                 is_op: np.ndarray, op_ids: np.ndarray, op_values: np.ndarray) -> None:
    """Set the op ids of the ops in `part` holding an External id that reads as a count."""
    sid, key, kind, ival, fval, scode = part
    rows = np.flatnonzero((key == external) & is_op[sid])
    if not len(rows):
        return
    at = np.searchsorted(op_ids, sid[rows])
    plain = (kind[rows] == KIND_INT) & (ival[rows] >= 0)
    op_values[at[plain]] = ival[rows[plain]]
    for i, r in zip(at[~plain].tolist(), rows[~plain].tolist(), strict=True):
        value = (fval[r] if kind[r] == KIND_FLOAT else
                 builder.distinct[scode[r]] if scode[r] >= 0 else None)
        op_values[i] = _count_or(value, int(op_ids[i]))
