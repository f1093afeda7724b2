"""A recorded NKI kernel: its instruction slices carry their kernel source line, and
`trace.kernel_lines(kernel)` gives time per line per engine."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import neuron_explorer
import numpy as np
import torch
from neuron_explorer import nki

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "nki"))
import matmul


def test_recorded_instructions_carry_the_kernel_line(tmp_path):
    lhsT = torch.randn(256, 128).bfloat16().to("neuron")
    rhs = torch.randn(256, 512).bfloat16().to("neuron")
    path = tmp_path / "nki.pftrace"
    with neuron_explorer.record(path, level="engine", quiet=True):
        matmul.matmul_tiled(lhsT, rhs)
        torch.neuron.synchronize()
    trace = neuron_explorer.load(path)
    lines = trace.kernel_lines(matmul.matmul_tiled)
    lines_src, first = inspect.getsourcelines(matmul.matmul_tiled.func)
    matmul_line = first + next(i for i, s in enumerate(lines_src) if "nisa.nc_matmul" in s)
    row = lines[lines["line"] == matmul_line]
    assert len(row) == 1 and row["file"].iloc[0].endswith("matmul.py")
    assert row["tensor_ns"].iloc[0] > 0 and row["dma_ns"].iloc[0] == 0
    dma_rows = lines[lines["dma_ns"] > 0]
    assert len(dma_rows) == 3  # the two loads and the store
    # the same per-line times as nki.benchmark of the same kernel on the same preset
    from neuron_explorer.backend import devices

    class Spec:
        shape, dtype = None, "bfloat16"

    a, b = Spec(), Spec()
    a.shape, b.shape = (256, 128), (256, 512)
    bench = nki.benchmark(matmul.matmul_tiled, a, b, preset=devices.get(0).preset)
    expected = {lt.line: lt.total_ns for lt in bench.line_times() if lt.line}
    assert dict(zip(lines["line"], lines["total_ns"], strict=True)) == expected
    stalls = {lt.line: sum(v for e, v in lt.stall_ns.items() if e != "dma")
              for lt in bench.line_times() if lt.line}
    assert dict(zip(lines["line"], lines["stall_ns"], strict=True)) == stalls
    assert lines.loc[lines["line"] == matmul_line, "stall_ns"].iloc[0] > 0  # waits for DMA
    assert np.isclose(lines["share"].sum(), 1.0)
    (prof,) = trace.kernel_profile(matmul.matmul_tiled).to_dict("records")
    expected_prof = bench.profile()
    assert prof["critical_engine"] == expected_prof["critical_engine"] == "dma"
    # the same busy time (the run may last longer: the cold Tensor Engine ramp)
    assert prof["dur_ns"] >= bench.duration_ns
    assert np.isclose(prof["busy_dma_pct"] * prof["dur_ns"],
                      expected_prof["busy_pct"]["dma"] * bench.duration_ns, rtol=1e-3)
    assert np.isclose(prof["dma_compute_overlap_pct"],
                      expected_prof["dma_compute_overlap_pct"], rtol=1e-3)
    assert prof["sbuf_bytes"] == expected_prof["sbuf_bytes"] > 0
