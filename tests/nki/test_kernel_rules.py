"""The kernel rules fire on the kernel that shows their problem and on no other
(tests/nki/kernel_cases.py, recorded once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_cases


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    trace = kernel_cases.record(tmp_path_factory.mktemp("rules") / "cases.pftrace")
    return trace, trace.bottlenecks()


def flagged(findings, rule_id: str) -> dict[str, object]:
    """Kernel name -> its finding of `rule_id`."""
    return {f.title.split(":")[0].removeprefix("Kernel "): f
            for f in findings[1] if f.rule_id == rule_id}


def test_a_single_buffer_serialises_dma_and_compute(findings):
    found = flagged(findings, "kernel_dma_not_pipelined")
    assert "serial" in found and "pipelined" not in found
    f = found["serial"]
    assert f.time_lost_ns > 0 and "affine_range" in f.recommendation
    assert "waits" in f.explanation and "kernel_cases.py:" in f.explanation  # names the line


def test_sbuf_near_capacity_is_pressure(findings):
    found = flagged(findings, "kernel_memory_pressure")
    assert set(found) == {"big_sbuf", "spilling"}
    assert "SBUF 8" in found["big_sbuf"].title and found["big_sbuf"].severity == "medium"


def test_live_tiles_past_sbuf_are_spills_with_their_bytes_and_time(findings):
    f = flagged(findings, "kernel_memory_pressure")["spilling"]
    assert f.title == "Kernel spilling: SBUF spills"
    # two 4 MiB blocks go to HBM and come back (closed form: 9 live, 7 fit)
    assert "stores 8.0 MiB" in f.explanation and "reloads 8.0 MiB" in f.explanation
    assert f.time_lost_ns > 0 and "no compute engine works" in f.explanation
    assert any("kernel_cases.py:" in e["description"] for e in f.evidence)
    assert "tile the free dimension" in f.recommendation


def test_the_kernel_report_shows_the_spills(findings):
    from neuron_explorer.kernel_report import kernel_summary

    s = kernel_summary(findings[0], "spilling")
    assert s["spill_bytes"] == 4 * 4 * 2**20 and s["reload_bytes"] == 2 * 4 * 2**20
    assert s["spill_ns"] > 0 and any("do not fit" in line for line in s["why"])
    assert kernel_summary(findings[0], "pipelined")["spill_bytes"] == 0


def test_matmuls_that_fill_a_sixteenth_of_the_array(findings):
    found = flagged(findings, "kernel_matmul_tile_shape")
    assert "narrow_matmul" in found and "full_matmul" not in found
    f = found["narrow_matmul"]
    assert "16.0x the FLOPs" in f.explanation and "tile_size.pmax" in f.recommendation
    assert f.time_lost_ns > 0


def test_tiny_tiles_are_small_dma_and_large_ones_are_not(findings):
    found = flagged(findings, "kernel_small_dma")
    assert "tiny_loads" in found and "pipelined" not in found and "serial" not in found
    # at the peak rate no transfer size saves time (it was told 68% overhead)
    assert "streaming" not in found
    f = found["tiny_loads"]
    assert any("kernel_cases.py:" in e["description"] and "overhead" in e["description"]
               for e in f.evidence)
    assert f.time_lost_ns > 0
    # the fixed cost it names is this hardware's: descriptor generation, then trigger to
    # first byte (the preset's figures, recorded in the trace)
    fixed = findings[0].hardware_figures["dma_fixed_ns"]
    assert fixed > 0 and f"~{fixed / 1e3:.1f} us on this hardware" in f.explanation


def test_the_report_shows_each_kernels_line_profile_and_why(findings):
    from neuron_explorer.report import render_report

    text = render_report(findings[0], "text")
    assert "Kernel serial: profile" in text and "Kernel serial: line profile" in text
    assert "not pipelined" in text  # the why line, from its 0% overlap
    assert "nisa.dma_copy(dst=buf" in text  # the source of the load line


def test_the_json_report_has_each_kernels_summary_and_lines(findings):
    import json

    from neuron_explorer.report import render_report

    kernels = {k["kernel"]: k for k in json.loads(render_report(findings[0], "json"))["kernels"]}
    assert {"serial", "pipelined", "narrow_matmul", "tiny_loads", "big_sbuf",
            "full_matmul"} <= set(kernels)
    serial = kernels["serial"]
    assert serial["critical_engine"] in ("dma", "vector", "scalar")
    assert serial["dma_compute_overlap_pct"] < kernels["pipelined"]["dma_compute_overlap_pct"]
    assert any("nisa.dma_copy(dst=buf" in line["code"] and line["engine"] == "dma"
               for line in serial["lines"])
