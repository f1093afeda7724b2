"""Which files make up a multi-rank run, and which rank each one is.

A run is a folder (our `record -- torchrun ...` run folder, or a folder of per-rank
PyTorch-profiler files) or a list of paths. A file's rank comes from the trace
itself where it says (our metadata's `rank`, Kineto's `distributedInfo.rank`), else
from its name (`rank3.pftrace`, `rank-3.json.gz`, `..._rank_3...`), else from its
position in name order.
"""

from __future__ import annotations

import ast
import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.errors import (
    NeuronExplorerError,
    TraceFormatError,
    TraceFormatWarning,
)

TRACE_SUFFIXES = (".pftrace", ".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
MANIFEST = "manifest.json"
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def is_trace_file(name: str) -> bool:
    """A file name a trace could have (the run manifest is not one)."""
    return name != MANIFEST and name.lower().endswith(TRACE_SUFFIXES)


def run_paths(source: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """The trace files of a run: every trace file in a folder, or the given paths."""
    if isinstance(source, (str, os.PathLike)):
        folder = os.fspath(source)
        if not os.path.isdir(folder):
            raise TraceFormatError(folder, "not a folder of per-rank traces")
        paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if is_trace_file(n)
                       and os.path.isfile(os.path.join(folder, n)))
        if not paths:
            raise TraceFormatError(
                folder, "the folder holds no trace files (.pftrace, .json, .json.gz); give a "
                "trace file, a run folder written by `neuron-explorer record -- torchrun ...` "
                "or a folder of per-rank PyTorch-profiler traces")
        return _without_other_json(folder, _without_empty(folder, paths))
    paths = [os.fspath(p) for p in source]
    if not paths:
        raise NeuronExplorerError("an empty list of traces: give at least one path")
    return paths


def _without_empty(folder: str, paths: list[str]) -> list[str]:
    """A folder's trace files less the empty ones (left by a process killed before it wrote
    anything), said in one warning; none left is an error."""
    empty = [p for p in paths if os.path.getsize(p) == 0]
    if not empty:
        return paths
    names = ", ".join(os.path.basename(p) for p in empty[:3]) + (", ..." if len(empty) > 3
                                                                 else "")
    if len(empty) == len(paths):
        raise TraceFormatError(folder, f"every trace file in the folder is empty ({names})")
    warnings.warn(f"{folder}: left out {len(empty)} empty trace file(s) ({names}): a process "
                  "killed before it wrote anything leaves one", TraceFormatWarning, stacklevel=4)
    return [p for p in paths if p not in empty]


# a JSON file read whole up to this size (decompressed) is known not to be a trace when it
# holds no event list; a larger one is left for the loader to judge
JSON_PEEK_BYTES = 8 << 20


def _without_other_json(folder: str, paths: list[str]) -> list[str]:
    """A folder's trace files less the small JSON files that are no trace (a config, a
    results file, notes kept beside the traces), said in one warning: one such file made
    the whole run fail to load. None left is an error."""
    others = [p for p in paths if _other_json(p)]
    if not others:
        return paths
    names = ", ".join(os.path.basename(p) for p in others[:3]) + (", ..." if len(others) > 3
                                                                  else "")
    if len(others) == len(paths):
        raise TraceFormatError(folder, f"the folder's JSON files hold no trace events ({names}): "
                               "give a folder of per-rank traces")
    warnings.warn(f"{folder}: left out {len(others)} JSON file(s) that hold no trace events "
                  f"({names})", TraceFormatWarning, stacklevel=4)
    return [p for p in paths if p not in others]


def _other_json(path: str) -> bool:
    """Whether `path` is a JSON file, read whole, with no Chrome-trace event list (neither
    a `traceEvents` key nor a bare list of events)."""
    import gzip

    if path.lower().endswith(".pftrace"):
        return False
    try:
        opener = gzip.open if path.lower().endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(JSON_PEEK_BYTES + 1)
    except (OSError, EOFError):
        return False  # unreadable or damaged: the loader says how
    if len(head) > JSON_PEEK_BYTES:
        return False
    return b'"traceEvents"' not in head and not head.lstrip().startswith(b"[")


def read_manifest(folder: str) -> dict[str, Any]:
    """The run folder's manifest (world size, command, preset, topology), or {}."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def distributed_info(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Rank and world size from a trace's metadata: ours (`rank`, `world_size`) or a
    PyTorch-profiler trace's `distributedInfo` (kept as a dict or as its text)."""
    info: dict[str, Any] = {}
    raw = metadata.get("distributedInfo")
    if isinstance(raw, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                raw = parse(raw)
                break
            except (ValueError, SyntaxError):
                continue
    if isinstance(raw, dict):
        info.update({k: raw[k] for k in ("rank", "world_size", "backend") if k in raw})
    for key in (tf.META_RANK, tf.META_WORLD_SIZE):
        if metadata.get(key) is not None:
            info[key] = metadata[key]
    for key in ("rank", "world_size"):
        if key in info:
            try:
                info[key] = int(info[key])
            except (TypeError, ValueError):
                del info[key]
    return info


def rank_from_name(path: str) -> int | None:
    """The rank a file's name gives (`rank3.pftrace`, `rank-3.json.gz`), or None."""
    found = _RANK_IN_NAME.findall(os.path.basename(path))
    return int(found[-1]) if found else None


def assign_ranks(paths: list[str], metadata_ranks: list[int | None]) -> list[int]:
    """Each file's rank: its trace's own word, else its name, else its place in the list;
    two files with one rank are an error naming both."""
    ranks: list[int] = []
    for i, (path, own) in enumerate(zip(paths, metadata_ranks, strict=True)):
        named = rank_from_name(path)
        ranks.append(own if own is not None else named if named is not None else i)
    seen: dict[int, str] = {}
    for path, rank in zip(paths, ranks, strict=True):
        if rank in seen:
            raise NeuronExplorerError(
                f"two traces are rank {rank}: {seen[rank]} and {path}; a run holds one trace "
                "per rank")
        seen[rank] = path
    return ranks
