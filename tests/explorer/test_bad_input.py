"""Empty, truncated, corrupt, foreign and missing files: one clear error, or a partial load."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import neuron_explorer
import pytest
import scenarios
from neuron_explorer.common.errors import (
    DamagedTraceWarning,
    TraceFormatError,
    TruncatedTraceWarning,
)


def _error(path: Path) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        neuron_explorer.load(path)
    assert str(path) in str(info.value)
    return info.value


def test_missing_file(tmp_path: Path) -> None:
    err = _error(tmp_path / "nope.pftrace")
    assert "no such file" in err.reason


def test_folder(tmp_path: Path) -> None:
    assert "folder" in _error(tmp_path).reason


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pftrace"
    path.write_bytes(b"")
    err = _error(path)
    assert "empty" in err.reason and err.position == 0


def test_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "picture.pftrace"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    err = _error(path)
    assert "not a trace" in err.reason and err.position == 0


def test_json_that_is_not_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"lr": 0.1}))
    assert "traceEvents" in _error(path).reason


def test_truncated_json_loads_its_complete_events(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    events = scenarios.basic().b.chrome_events()
    text = json.dumps({"traceEvents": events})
    path.write_text(text[: len(text) // 2])
    with pytest.warns(TruncatedTraceWarning, match="the JSON ends early"):
        t = neuron_explorer.load(path)
    assert t.warnings and "cut.json" in t.warnings[0]
    assert 0 < len(t.table("slices")) < len([e for e in events if e["ph"] != "M"])


def test_json_cut_before_its_first_event(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"traceEvents": [{"ph": "X", "na')
    err = _error(path)
    assert "truncated" in err.reason and err.position is not None and err.position > 0


def test_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "cut.json.gz"
    data = gzip.compress(json.dumps({"traceEvents": []}).encode() * 50)
    path.write_bytes(data[: len(data) // 2])
    assert "truncated" in _error(path).reason


def test_truncated_pftrace_loads_complete_packets(tmp_path: Path) -> None:
    sc = scenarios.basic()
    full = neuron_explorer.load(sc.write(tmp_path, "full"))
    cut = sc.b.write_pftrace(tmp_path / "cut.pftrace", truncate=3)
    with pytest.warns(TruncatedTraceWarning, match="ends inside a packet"):
        t = neuron_explorer.load(cut)
    assert t.warnings and "cut.pftrace" in t.warnings[0]
    # the last packet (an end) is lost: every slice is still there, one closed at trace end
    assert len(t.table("slices")) == len(full.table("slices"))
    assert t.skipped.get("slice never ended (closed at trace end)") == 1
    assert len(t.ops) == len(full.ops)


def test_pftrace_cut_inside_its_first_packet(tmp_path: Path) -> None:
    # a packet tag, then a length running past the end of the file
    path = tmp_path / "first.pftrace"
    path.write_bytes(b"\x0a\xff\xff\xff garbage" * 10)
    err = _error(path)
    assert "no complete Perfetto packet" in err.reason and err.position == 0


def test_a_pftrace_damaged_part_way_loads_what_comes_before_with_a_warning(
        tmp_path: Path) -> None:
    whole = scenarios.basic().write(tmp_path, "whole")
    data = bytearray(whole.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 40] = b"\xff" * 40
    path = tmp_path / "bad.pftrace"
    path.write_bytes(bytes(data))
    with pytest.warns(DamagedTraceWarning, match=r"byte \d+.*loaded the \d+ packets before it"):
        damaged = neuron_explorer.load(path, cache=False)
    complete = neuron_explorer.load(whole, cache=False)
    # the slices that start before the damage are all there, and nothing after it
    assert 0 < len(damaged.slices) < len(complete.slices)
    assert set(damaged.slices["name"]) <= set(complete.slices["name"])
    # the steps after the damage lost their events: the analyses know it
    from neuron_explorer.analyses.steady_state import device_data_end

    assert device_data_end(damaged) is not None and device_data_end(complete) is None


def test_unknown_json_events_are_counted(tmp_path: Path) -> None:
    events = scenarios.basic().b.chrome_events()
    events += [{"ph": "P", "name": "sample", "pid": 1, "tid": 1, "ts": 5},
               {"ph": "P", "name": "sample", "pid": 1, "tid": 1, "ts": 6}, "junk"]
    path = tmp_path / "extra.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = neuron_explorer.load(path)
    assert t.skipped == {"event phase 'P'": 2, "not an event object": 1}
    assert len(t.ops) == 6


def test_unknown_pftrace_events_are_counted(tmp_path: Path) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    path = scenarios.basic().write(tmp_path, "plus")
    extra = pb.Trace()
    p = extra.packet.add()
    p.timestamp = 5
    p.trusted_packet_sequence_id = 7
    p.track_event.type = pb.TrackEvent.TYPE_STATE if hasattr(pb.TrackEvent, "TYPE_STATE") else 5
    q = extra.packet.add()
    q.clock_snapshot.primary_trace_clock = 6
    path.write_bytes(path.read_bytes() + extra.SerializeToString())
    t = neuron_explorer.load(path)
    assert t.skipped.get("track event type 5") == 1
    assert t.skipped.get("packet field 6") == 1
    assert len(t.ops) == 6


def test_cli_reports_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from neuron_explorer.commands import report as report_command

    path = tmp_path / "empty.json"
    path.write_text("")
    import argparse

    parser = argparse.ArgumentParser()
    report_command.configure(parser)
    with pytest.raises(TraceFormatError, match="empty"):
        report_command.run(parser.parse_args([str(path)]))
