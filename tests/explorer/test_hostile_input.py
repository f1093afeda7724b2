"""Hostile and malformed input: bombs refused in bounded memory, every malformed field a
TraceFormatError naming the event, load time that does not grow with nesting."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import neuron_explorer
import numpy as np
import pytest
from neuron_explorer.common.errors import NeuronExplorerError, TraceFormatError
from neuron_explorer.loaders import inflate, nesting

MIB = 1 << 20


def _bomb(path: Path, inflated_mib: int) -> Path:
    """A gzip of `inflated_mib` MiB of spaces, as members of 16 MiB (quick to make)."""
    member = gzip.compress(b" " * (16 * MIB), 9)
    path.write_bytes(member * (inflated_mib // 16))
    return path


def _error(path: Path, **kw: Any) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        neuron_explorer.load(path, **kw)
    assert str(path) in str(info.value)
    return info.value


def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    path = _bomb(tmp_path / "bomb.json.gz", 256)
    tracemalloc.start()
    try:
        err = _error(path, max_bytes=8 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "inflates to more than 8,388,608 bytes" in err.reason
    assert "NEURON_EXPLORER_MAX_TRACE_BYTES" in err.reason
    assert peak < 8 * MIB + 3 * inflate._CHUNK  # the limit and a chunk or two, not 256 MiB


@pytest.mark.slow  # inflates 256 MiB
def test_gzip_limit_by_default_is_a_multiple_of_the_file(tmp_path: Path) -> None:
    assert inflate.gzip_limit(1 * MIB, None) == 256 * MIB  # the floor: small traces pass
    assert inflate.gzip_limit(10 * MIB, None) == 1000 * MIB  # 100 times the file
    assert inflate.gzip_limit(1 << 30, None) == 4 << 30  # the ceiling
    path = _bomb(tmp_path / "bomb.json.gz", 272)  # 17 members: ~270 KiB inflating 1000x
    assert "inflates to more than 268,435,456 bytes" in _error(path).reason


def test_trace_size_limit_from_the_environment(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    events = [{"ph": "X", "name": "a", "ts": i, "dur": 1, "pid": 1, "tid": 1}
              for i in range(2000)]
    gz = tmp_path / "small.json.gz"
    gz.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    plain = tmp_path / "small.json"
    plain.write_text(json.dumps({"traceEvents": events}))
    assert len(neuron_explorer.load(gz).table("slices")) == 2000
    monkeypatch.setenv(inflate.ENV_MAX_BYTES, "10000")
    assert "more than 10,000 bytes" in _error(gz).reason
    assert "more than the limit of 10,000" in _error(plain).reason
    assert len(neuron_explorer.load(gz, max_bytes=10 * MIB).table("slices")) == 2000
    monkeypatch.setenv(inflate.ENV_MAX_BYTES, "lots")
    with pytest.raises(NeuronExplorerError, match="NEURON_EXPLORER_MAX_TRACE_BYTES='lots'"):
        neuron_explorer.load(gz)


def test_gzip_members_and_trailing_data(tmp_path: Path) -> None:
    text = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1,
                                        "pid": 1, "tid": 1}]}).encode()
    cut = len(text) // 2
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]) + bytes(8))
    assert len(neuron_explorer.load(path).table("slices")) == 1
    path.write_bytes(gzip.compress(text) + b"junk")
    assert "after the end of the gzip stream" in _error(path).reason


# --- malformed fields of loadable-looking JSON ------------------------------------------

def _x(**fields: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": "op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0,
             "dur": 2.0}
    event.update(fields)
    return event


def _without(event: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != key}


MALFORMED = {
    "ts_text": ([_x(), _x(ts="abc")], 1, "'ts' is 'abc'"),
    "ts_missing": ([_x(), _without(_x(), "ts")], 1, "'ts' is missing"),
    "ts_huge": ([_x(ts=1e300)], 0, "'ts' is 1e+300"),
    "ts_object": ([_x(ts={"a": 1})], 0, "'ts' is {\"a\": 1}"),
    "dur_list": ([_x(dur=[1])], 0, "'dur' is [1]"),
    "pid_huge": ([_x(pid=2**63)], 0, "'pid' 9223372036854775808 is out of range"),
    "tid_object": ([_x(tid={})], 0, "'tid' must be a number or a string"),
    "args_number": ([_x(), _x(args=1.5)], 1, "'args' must be an object, not 1.5"),
    "args_list": ([_x(args=[1, 2])], 0, "'args' must be an object"),
    "kernel_args": ([_x(), _x(cat="kernel", pid=0, tid=7, args="gemm")], 1,
                    "'args' must be an object, not 'gemm'"),
    "M_args": ([_x(), {"ph": "M", "name": "process_name", "pid": 1, "args": 1.5}], 1,
               "'args' must be an object"),
    "flow_id": ([_x(), {"ph": "s", "id": {}, "pid": 1, "tid": 1, "ts": 1.5}], 1,
                "a flow's 'id' must be a number or a string"),
    "flow_ts": ([_x(), {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": "x"}], 1, "'ts' is 'x'"),
    "counter_value": ([_x(), {"ph": "C", "name": "c", "pid": 1, "ts": 1, "args": {"v": "x"}}],
                      1, "counter values must be numbers"),
    "counter_ts": ([_x(), {"ph": "C", "name": "c", "pid": 1, "ts": [], "args": {"v": 1}}], 1,
                   "'ts' is []"),
    "counter_args": ([{"ph": "C", "name": "c", "pid": 1, "ts": 1, "args": "v"}], 0,
                     "'args' must be an object"),
    "end_ts": ([{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1},
                {"ph": "E", "pid": 1, "tid": 1, "ts": "later"}], 1, "'ts' is 'later'"),
    "end_args": ([{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1},
                  {"ph": "E", "pid": 1, "tid": 1, "ts": 2, "args": 3}], 1,
                 "'args' must be an object"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_json_field_names_the_event(tmp_path: Path, case: str) -> None:
    events, index, reason = MALFORMED[case]
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps({"traceEvents": events}))
    err = _error(path)
    assert err.event == index and f"at event {index}" in str(err)
    assert reason in err.reason


@pytest.mark.parametrize("doc, reason", [
    ({"schemaVersion": 1, "deviceProperties": 1.5}, "'deviceProperties' must be a list"),
    ({"deviceProperties": [{"totalGlobalMem": "lots"}]}, "'totalGlobalMem' must be a number"),
])
def test_malformed_kineto_metadata(tmp_path: Path, doc: dict[str, Any], reason: str) -> None:
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({**doc, "traceEvents": [_x(cat="cpu_op")]}))
    assert reason in _error(path).reason


def test_malformed_hardware_figures(tmp_path: Path) -> None:
    meta = {"ph": "i", "cat": "metadata", "name": "metadata", "pid": 1, "tid": 1, "ts": 0,
            "args": {"json": json.dumps({"hardware_figures": {"hbm_bytes": "lots"}})}}
    path = tmp_path / "figures.json"
    path.write_text(json.dumps({"traceEvents": [meta, _x()]}))
    assert "'hbm_bytes' must be a number" in _error(path).reason


def test_numeric_strings_are_read_as_numbers(tmp_path: Path) -> None:
    # Perfetto reads times written as strings too: the same trace either way
    path = tmp_path / "strings.json"
    path.write_text(json.dumps({"traceEvents": [_x(ts="1.5", dur="12"), _x(ts=20, dur=1)]}))
    t = neuron_explorer.load(path)
    assert t.table("slices")["ts"].tolist() == [1500, 20000]
    assert t.table("slices")["dur"].tolist() == [12000, 1000]


# --- nesting: linear whatever the depth -------------------------------------------------

def test_identical_slices_nest_in_each_other(tmp_path: Path) -> None:
    path = tmp_path / "same.json"
    path.write_text(json.dumps({"traceEvents": [_x() for _ in range(3000)]}))
    s = neuron_explorer.load(path).table("slices")
    assert s["depth"].tolist() == list(range(3000))
    assert s["parent_id"].tolist() == [-1, *range(2999)]


def _cpu_seconds(fn: Any) -> float:
    runs = []
    for _ in range(3):
        t0 = time.process_time()
        fn()
        runs.append(time.process_time() - t0)
    return min(runs)


def test_nesting_time_does_not_grow_with_depth() -> None:
    # 40k slices nested 40k deep against 40k side by side: a pass per depth made the
    # first hundreds of times slower (seconds); one sort keeps them alike
    n = 40_000
    track = np.zeros(n, np.int64)
    same = np.zeros(n, np.int64), np.full(n, 10, np.int64)
    apart = np.arange(n, dtype=np.int64) * 10, np.full(n, 5, np.int64)
    deep = _cpu_seconds(lambda: nesting.nest_complete(track, *same))
    flat = _cpu_seconds(lambda: nesting.nest_complete(track, *apart))
    assert deep < 20 * max(flat, 1e-3)
    # begin/end pairs: nested n deep, and n ends closing nothing, against n side by side
    tracks = np.zeros(2 * n, np.int64)
    side_by_side = np.tile([True, False], n), np.arange(2 * n, dtype=np.int64)
    flat = _cpu_seconds(lambda: nesting.match_begin_end(tracks, *side_by_side))
    nested = np.r_[np.ones(n, bool), np.zeros(n, bool)], np.repeat([0, 1], n).astype(np.int64)
    deep = _cpu_seconds(lambda: nesting.match_begin_end(tracks, *nested))
    assert deep < 20 * max(flat, 1e-3)
    strays = np.r_[np.zeros(n, bool), np.ones(n, bool)], np.arange(2 * n, dtype=np.int64)
    stray = _cpu_seconds(lambda: nesting.match_begin_end(tracks, *strays))
    assert stray < 20 * max(flat, 1e-3)


# --- a JSON recording killed part way -----------------------------------------------------

KILLED_WRITER = """
import os, signal, sys
from neuron_explorer.collectors.json_writer import JsonWriter
w = JsonWriter(sys.argv[1], chunk_bytes=1)  # every event reaches the file at once
proc = w.process(1, "python train.py")
main = w.thread(1, 1, "MainThread")
for step in range(14):
    w.slice(main, step * 1000, 900, f"ProfilerStep#{step}", "step", {"step": step})
    w.slice(main, step * 1000 + 100, 500, "aten::mm", "op", {"op_id": step + 1, "step": step})
w._emit('{"ph": "X", "cat": "op", "name": "aten::m')  # a line cut by the kill
w.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkilled_json_recording_loads_its_complete_events(tmp_path: Path) -> None:
    import subprocess
    import sys

    from neuron_explorer.common.errors import TruncatedTraceWarning
    from neuron_explorer.loaders.chrome_json import parse_json

    path = tmp_path / "killed.json"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], check=False,
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert not path.read_bytes().rstrip().endswith(b"]}")  # never closed
    with pytest.warns(TruncatedTraceWarning, match="ends early"):
        t = neuron_explorer.load(path)
    assert t.warnings and "killed.json" in t.warnings[0]
    assert len(t.steps) == 14 and len(t.ops) == 14
    doc, _ = parse_json(str(path), path.read_bytes())  # the complete events, then `{}`
    events = [e for e in doc["traceEvents"] if e]
    assert len(events) == 2 + 28 and events[-1]["name"] == "aten::mm"


# --- nothing raises after the load ----------------------------------------------------------

def _kineto_steps(per_process: dict[int, list[int]]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for pid, steps in per_process.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"python rank {pid}"}})
        for k, n in enumerate(steps):
            t = 100.0 * (k + 1)
            events += [
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": pid,
                 "tid": pid, "ts": t, "dur": 90.0},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid,
                 "ts": t + 10, "dur": 20.0, "args": {"External id": k}},
                {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                 "ts": t + 40 + pid / 100, "dur": 10.0, "args": {"correlation": k}},
            ]
    return {"schemaVersion": 1, "traceEvents": events}


@pytest.mark.parametrize("per_process, steps", [
    ({100: [1, 2, 3], 200: [1, 2, 3]}, [1, 2, 3]),  # two processes: one step each number
    ({100: [1, 2, 1]}, [0, 1, 2]),  # a number again on one track: numbered in time order
])
def test_duplicate_profiler_steps_reach_every_analysis(
        tmp_path: Path, per_process: dict[int, list[int]], steps: list[int]) -> None:
    from neuron_explorer.report import render_report

    path = tmp_path / "steps.json"
    path.write_text(json.dumps(_kineto_steps(per_process)))
    t = neuron_explorer.load(path)
    assert t.steps["step"].tolist() == steps
    assert t.summary()["n_steps"] == len(steps)
    assert set(t.breakdown()["step"]) <= set(steps)
    t.bottlenecks()
    for fmt in ("text", "md", "json", "html"):
        assert render_report(t, fmt)


def test_corrupt_pftrace_annotations_are_left_out_with_a_warning() -> None:
    from neuron_explorer.common.errors import TraceFormatWarning
    from neuron_explorer.report import render_report

    path = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus" / \
        "corrupt_annotation.pftrace"
    t = neuron_explorer.load(path)
    with pytest.warns(TraceFormatWarning, match="1 debug annotations .* are corrupt"):
        assert len(t.ops) > 0
    assert t.skipped["corrupt debug annotation"] == 1
    assert "left out" in t.warnings[-1]
    assert render_report(t, "text") and t.bottlenecks() is not None
    assert len(t.slices) == len(t.table("slices"))


# --- the command line and the rendered reports ---------------------------------------------

@pytest.mark.parametrize("command", ["report", "diff", "view"])
@pytest.mark.parametrize("content", [b"", b'{"traceEvents": [{"ph": "X", "ts": "abc"}]}',
                                     b"\x0a\x05\x40\x80\x80\x80\x80"])
def test_cli_turns_a_bad_trace_into_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture, command: str, content: bytes) -> None:
    from neuron_explorer.cli import main

    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    extra = {"diff": [str(bad)], "view": ["--no-browser"]}.get(command, [])
    args = [command, str(bad), *extra]  # view reads the trace before it serves anything
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"neuron-explorer {command}: error: cannot read trace {bad}")


def _hostile_names(tmp_path: Path) -> Path:
    import scenarios

    events = scenarios.basic().b.chrome_events()
    for e in events:
        if e.get("name") == "aten::mm":
            e["name"] = "<script>alert(1)</script>"
        if e.get("name") == "aten::relu":
            e["name"] = "[click](javascript:alert(1)) | *x*"
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_markdown_report_escapes_trace_strings(tmp_path: Path) -> None:
    from neuron_explorer.report import render_report

    md = render_report(neuron_explorer.load(_hostile_names(tmp_path)), "md")
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert r"\[click\](javascript:alert(1)) \| \*x\*" in md  # a literal, not a link
    assert "[click](" not in md


def test_html_report_escapes_trace_strings(tmp_path: Path) -> None:
    from neuron_explorer.report import render_report

    page = render_report(neuron_explorer.load(_hostile_names(tmp_path)), "html")
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_report_prints_parts_left_out_while_rendering(capsys: pytest.CaptureFixture) -> None:
    from neuron_explorer.cli import main

    path = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus" / \
        "corrupt_annotation.pftrace"
    assert main(["report", str(path)]) == 0
    captured = capsys.readouterr()
    assert "Neuron Explorer report" in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron-explorer report: warning: ")
    assert "debug annotations (slice args) are corrupt" in lines[0]


def test_numeric_args_past_64_bits_count_as_absent(tmp_path: Path) -> None:
    import warnings

    import scenarios

    events = scenarios.basic().b.chrome_events()
    op = next(e for e in events if e.get("cat") == "op")
    op["args"].update(flops=2**70, bytes="lots")
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = neuron_explorer.load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no cast of 1e21 to int64
        ops = t.ops
    row = ops.loc[ops["name"] == op["name"]].iloc[0]
    assert row["flops"] == 0 and row["bytes"] == 0


def test_device_files_are_refused_before_reading(tmp_path: Path) -> None:
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")  # endless: reading it would take all the memory
    assert "not a regular file" in _error(link).reason
