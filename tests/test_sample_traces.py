"""Every sample trace loads and yields the finding its README documents."""

from __future__ import annotations

import re
from pathlib import Path

import neuron_explorer
import pytest

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
ROW = re.compile(r"^\| `(?P<trace>[\w.]+\.pftrace)` \|.*\| `(?P<rule>\w+)` \|$")


def documented() -> list[tuple[str, str]]:
    rows = [ROW.match(line) for line in (SAMPLES / "README.md").read_text().splitlines()]
    return [(m["trace"], m["rule"]) for m in rows if m]


def test_readme_documents_every_sample_trace() -> None:
    listed = {trace for trace, _ in documented()}
    on_disk = {p.name for p in SAMPLES.glob("*.pftrace")}
    assert listed == on_disk and len(listed) >= 9


@pytest.mark.parametrize(("trace_name", "rule_id"), documented())
def test_sample_trace_yields_its_finding(trace_name: str, rule_id: str) -> None:
    path = SAMPLES / trace_name
    assert path.stat().st_size < 5 * 1024 * 1024, "sample traces stay under 5 MB"
    trace = neuron_explorer.load(path)
    assert len(trace.steps) >= 1 and len(trace.ops) > 0
    findings = trace.bottlenecks()
    assert rule_id in {f.rule_id for f in findings}, [f.title for f in findings]
    finding = next(f for f in findings if f.rule_id == rule_id)
    assert finding.time_lost_ns >= 0 and finding.recommendation and finding.evidence
