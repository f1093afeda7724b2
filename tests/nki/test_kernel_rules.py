"""The kernel rules fire on the kernel that shows their problem and on no other
(tests/nki/kernel_cases.py, recorded once)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import neuron_explorer
import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import pytest
import torch
from neuron_explorer import nki
from neuron_explorer.analyses.steady_state import in_analysed_steps

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_cases


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    # on the modelled host clock: what a kernel's findings save depends on how far the
    # device leads the host, and the measured host of a loaded machine (the suite's other
    # worker) once led it by nothing, every saving 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NEURON_HOST_CLOCK", "modelled")
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


def test_the_single_buffers_saving_is_the_pipelined_kernels_length(findings):
    """The saving is the kernel rescheduled with its tile rotated, which is what allocating
    it inside the loop (`pipelined`, the same work) gives."""
    trace, _ = findings
    f = flagged(findings, "kernel_dma_not_pipelined")["serial"]
    runs = trace.kernels.set_index("name")["dur"]
    diff = runs["serial"] - runs["pipelined"]
    # the kernel's saving; where the host sets the steps, the step saves only part of it
    # (its critical path), and the finding says both
    part = re.search(r"([\d.]+) (us|ms) less device time over the analysed steps shortens",
                     f.explanation)
    device = (float(part.group(1)) * (1e3 if part.group(2) == "us" else 1e6) if part
              else f.time_lost_ns)
    assert device == pytest.approx(diff, abs=2000)
    assert f.time_lost_ns <= device
    assert f.saving_basis.startswith("replay: the kernel rescheduled with its tiles rotated")
    assert "reuses its SBUF tiles' buffers" in f.explanation


@nki.jit
def _matmul_one_buffer(xT, w):
    """A [K, M] x [K, N] matmul loading into two tiles allocated once, before the loops:
    its compute hides under its DMA, yet each load waits for the matmul before it."""
    K, M = xT.shape
    N = w.shape[1]
    out = nl.ndarray((M, N), dtype=xT.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 128), dtype=xT.dtype, buffer=nl.sbuf)
    y = nl.ndarray((128, 512), dtype=w.dtype, buffer=nl.sbuf)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                nisa.dma_copy(dst=x, src=xT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                nisa.dma_copy(dst=y, src=w[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                nisa.nc_matmul(dst=acc, stationary=x, moving=y)
            res = nl.ndarray((128, 512), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc, dtype=out.dtype)
            nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], src=res)
    return out


def test_a_kernel_whose_compute_hides_under_its_dma_still_pipelines(tmp_path, monkeypatch):
    """A user's bf16 projection loaded into one x and one w tile: 89% of its matmuls ran
    under its DMA, so the overlap test saw it pipelined (and its Tensor Engine, 9.9% busy,
    was under the rule's floor), while allocating the tiles in the loop saved 47% of each
    run. The rotated schedule is that fix's run, to the nanosecond."""
    from neuron_explorer.nki.launch import HostArg
    from neuron_explorer.nki.runner import run

    xT = torch.randn(1024, 256).bfloat16().to("neuron")
    w = torch.randn(1024, 1024).bfloat16().to("neuron")
    path = tmp_path / "one_buffer.pftrace"
    monkeypatch.setenv("NEURON_HOST_CLOCK", "modelled")  # the device sets each step
    with neuron_explorer.record(path, level="engine", quiet=True):
        for _ in range(3):
            _matmul_one_buffer(xT, w)
            torch.neuron.synchronize()
            neuron_explorer.step()
    trace = neuron_explorer.load(path)
    (f,) = [g for g in trace.bottlenecks() if g.rule_id == "kernel_dma_not_pipelined"]
    runs = in_analysed_steps(trace, trace.kernels)
    runs = runs[runs["name"] == "_matmul_one_buffer"]
    # the fix: the same kernel with x and y allocated inside the k loop
    host = [HostArg(t.float().cpu().numpy(), "bfloat16") for t in (xT, w)]
    fixed = run(_rotated_twin(), tuple(host), {}, numerics=False).kernel.duration_ns
    one = run(_matmul_one_buffer, tuple(host), {}, numerics=False).kernel.duration_ns
    assert fixed < 0.8 * one
    assert f.time_lost_ns == pytest.approx(len(runs) * (one - fixed), rel=0.01)


def _rotated_twin():
    @nki.jit
    def twin(xT, w):
        K, M = xT.shape
        N = w.shape[1]
        out = nl.ndarray((M, N), dtype=xT.dtype, buffer=nl.shared_hbm)
        for m in nl.affine_range(M // 128):
            for n in nl.affine_range(N // 512):
                acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
                for k in nl.affine_range(K // 128):
                    x = nl.ndarray((128, 128), dtype=xT.dtype, buffer=nl.sbuf)
                    y = nl.ndarray((128, 512), dtype=w.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=x, src=xT[k * 128:(k + 1) * 128,
                                                m * 128:(m + 1) * 128])
                    nisa.dma_copy(dst=y, src=w[k * 128:(k + 1) * 128,
                                               n * 512:(n + 1) * 512])
                    nisa.nc_matmul(dst=acc, stationary=x, moving=y)
                res = nl.ndarray((128, 512), dtype=out.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res, src=acc, dtype=out.dtype)
                nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512],
                              src=res)
        return out
    return twin


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


def test_rotating_a_single_buffer_schedules_the_pipelined_kernel():
    """backend/hardware/rotated.py: `serial` with its one tile rotated is `pipelined`,
    which allocates a tile per iteration, to the nanosecond; rotating `pipelined` changes
    nothing."""
    import numpy as np
    from neuron_explorer.backend.hardware.rotated import rotated_length_ns
    from neuron_explorer.nki.runner import run

    a = np.random.default_rng(0).random((kernel_cases.TILES * 128, kernel_cases.WIDTH),
                                        np.float32)
    serial = run(kernel_cases.serial, (a,), {}, numerics=False)
    pipelined = run(kernel_cases.pipelined, (a,), {}, numerics=False)
    assert serial.kernel.duration_ns > 1.3 * pipelined.kernel.duration_ns
    assert rotated_length_ns(serial.builder) == pipelined.kernel.duration_ns
    assert rotated_length_ns(pipelined.builder) == pipelined.kernel.duration_ns


def test_a_prediction_runs_a_custom_kernel_as_recorded(tmp_path, monkeypatch):
    """An NKI launch has no op key: the replay took it for a sync point and dropped its
    kernel, so a run whose kernel took 800 us a step was predicted the same step as with a
    kernel twice as fast, and compiling the model was claimed to save that time. Replayed
    as it ran, the eager prediction is the recording."""
    from neuron_explorer.what_if.replay import predicted_step_ns

    # sizes of its own: a kernel launched before in the process (the test above) records
    # no compile span, and with it no rotated length, in a later recording
    xT = torch.randn(1024, 512).bfloat16().to("neuron")
    w = torch.randn(1024, 1024).bfloat16().to("neuron")
    path = tmp_path / "kernel_and_ops.pftrace"
    monkeypatch.setenv("NEURON_HOST_CLOCK", "modelled")
    with neuron_explorer.record(path, level="op", quiet=True):
        for _ in range(4):
            _matmul_one_buffer(xT, w).float().sum().item()
            neuron_explorer.step()
    trace = neuron_explorer.load(path)
    recorded = float(in_analysed_steps(trace, trace.steps)["dur"].median())
    kernel = float(trace.kernels.loc[trace.kernels["name"] == "_matmul_one_buffer",
                                     "dur"].median())
    assert kernel > 0.3 * recorded  # the premise: the kernel is much of the step
    assert predicted_step_ns(trace, "eager") == pytest.approx(recorded, rel=0.02)
