"""Fuzzed trace files for the loader tests: seeds in both formats and the mutations the
fuzz test draws (truncations, bit flips, random bytes, wrong types in fields, bombs).

`check_load(path)` is the property: a load either succeeds, and then every analysis
and the report run without error, or raises TraceFormatError; nothing else.
"""

from __future__ import annotations

import gzip
import json
import sys
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import neuron_explorer
import scenarios
from hypothesis import strategies as st
from neuron_explorer.common.errors import TraceFormatError

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@cache
def seeds(folder: str) -> dict[str, bytes]:
    """Small valid traces: the basic scenario in both formats, and a recording written by
    the collectors' own .pftrace and Kineto writers (interning, descriptors, flows)."""
    tmp = Path(folder)
    tmp.mkdir(parents=True, exist_ok=True)
    sc = scenarios.basic()
    out = {"basic.pftrace": sc.write(tmp, "basic").read_bytes(),
           "basic.json": sc.write(tmp, "basic", "json").read_bytes()}
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_load
    finally:
        sys.path.remove(str(BENCHMARKS))
    ev = bench_load.events(400)
    bench_load.write_pftrace(tmp / "recorded.pftrace", ev)
    bench_load.write_kineto(tmp / "kineto.json", ev)
    out["recorded.pftrace"] = (tmp / "recorded.pftrace").read_bytes()
    out["kineto.json"] = (tmp / "kineto.json").read_bytes()
    return out


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value, with the edges loaders trip on (huge ints, odd floats, nesting)."""
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([2**63, -(2**63) - 1, 2**64, 1e300, -1e300, 0.5, -1, 0, "12", "abc",
                         "", "1e400", "<script>"]),
        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    )
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
        max_leaves=6)


FIELDS = ["ts", "dur", "pid", "tid", "args", "id", "name", "cat", "ph", "bp", "s"]


@st.composite
def wrong_fields(draw: st.DrawFn, text: bytes) -> bytes:
    """A JSON trace with a few fields of its events (or its top level) set to any value."""
    doc = json.loads(text)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for _ in range(draw(st.integers(1, 3))):
        if isinstance(doc, dict) and draw(st.integers(0, 9)) == 0:
            key = draw(st.sampled_from(["deviceProperties", "schemaVersion", "traceEvents"]))
            doc[key] = draw(json_values())
            continue
        i = draw(st.integers(0, len(events) - 1))
        event = events[i]
        if not isinstance(event, dict):
            continue
        action = draw(st.integers(0, 4))
        if action == 0 and event:
            del event[draw(st.sampled_from(sorted(event)))]
        elif action == 1 and isinstance(event.get("args"), dict) and event["args"]:
            event["args"][draw(st.sampled_from(sorted(event["args"])))] = draw(json_values())
        else:
            event[draw(st.sampled_from(FIELDS))] = draw(json_values())
    return json.dumps(doc).encode()


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """Truncated, bit-flipped, overwritten or spliced bytes of a valid file."""
    kind = draw(st.sampled_from(["truncate", "flip", "overwrite", "splice"]))
    buf = bytearray(data)
    if kind == "truncate":
        return bytes(buf[: draw(st.integers(0, len(buf)))])
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, len(buf) - 1))
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        return bytes(buf)
    if kind == "overwrite":
        pos = draw(st.integers(0, len(buf) - 1))
        chunk = draw(st.binary(min_size=1, max_size=16))
        buf[pos:pos + len(chunk)] = chunk
        return bytes(buf)
    a, b = sorted(draw(st.lists(st.integers(0, len(buf)), min_size=2, max_size=2)))
    return bytes(buf[:a] + buf[b:] + buf[a:b])  # a block moved to the end


def random_bytes() -> st.SearchStrategy[bytes]:
    """Random bytes, some starting like a trace would (a packet tag, JSON, gzip)."""
    return st.tuples(st.sampled_from([b"", b"\x0a", b"{", b"[", b"\x1f\x8b"]),
                     st.binary(max_size=512)).map(lambda p: p[0] + p[1])


# every Trace analysis that needs no argument (`test_fuzz.py` checks the list is whole)
ANALYSES = ("annotations", "bottlenecks", "breakdown", "collectives", "communication",
            "compile_summary", "copy_bandwidth", "counter_series", "counter_summary",
            "critical_path", "cupti_counters", "efficiency", "engine_utilisation",
            "idle_reasons", "kernel_sequences", "kernel_stats", "kernel_types", "kv_cache",
            "launch_stats", "memory_at_peak", "memory_timeline", "module_stats", "op_kernels",
            "op_stats", "phases", "queue_length", "queue_length_summary", "requests",
            "roofline", "serving", "step_times", "stream_idle", "summary",
            "temporal_breakdown", "token_times")


def check_load(path: Path, **kw: Any) -> neuron_explorer.Trace | None:
    """Load, then run everything an analysis or a report reads; only TraceFormatError may
    come out, and only from the load."""
    from neuron_explorer.report import render_report

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = neuron_explorer.load(path, **kw)
    except TraceFormatError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("slices", "flows", "steps", "ops", "kernels", "instructions", "modules"):
            getattr(trace, name)
        for analysis in ANALYSES:
            getattr(trace, analysis)()
        render_report(trace, "md")  # the summary, the stats and every rule's findings
    return trace


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, 1)
