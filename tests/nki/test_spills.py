"""NKI kernels whose live SBUF tiles exceed a partition's SBUF spill to HBM instead of
failing (backend/hardware/spills.py): the numbers are unchanged, the schedule has the
stores and reloads, attributed to the kernel's lines, and the profile counts them."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import spilling as sum_of_loaded  # every block loaded, then summed
from neuron_explorer import nki
from neuron_explorer.backend.hardware import KernelBuilder, get_preset
from neuron_explorer.nki import language as nl

WIDTH = 8192  # fp32: 32 KiB per partition per tile, 6 of them fill a trn1 partition


@nki.jit
def references_kept(a):
    """Keeps a Python reference to every block, but reads each once: none is live after."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    kept = []
    for t in range(a.shape[0] // 128):
        x = nl.load(a[t * 128:(t + 1) * 128, :])
        nl.store(out[t * 128:(t + 1) * 128, :], value=x)
        kept.append(x)
    return out


def blocks(n: int) -> np.ndarray:
    return np.random.default_rng(0).random((128 * n, WIDTH), dtype=np.float32)


def spill_rows(bench) -> list[dict]:
    return [r for r in bench.schedule() if r["opcode"] in ("DmaSpill", "DmaReload")]


@pytest.mark.parametrize("n", [5, 6, 8])
def test_live_blocks_past_sbuf_spill_as_many_blocks_as_the_excess(n):
    """n blocks and the first sum are live at once: n + 1 blocks of the 6 that fit on
    trn1; those used last go to HBM and come back, 4 MiB each way per block."""
    a = blocks(n)
    out = nki.simulate_kernel(sum_of_loaded, a, preset="trn1")
    np.testing.assert_allclose(out, a.reshape(n, 128, WIDTH).sum(0), rtol=1e-5)
    bench = nki.benchmark(sum_of_loaded, a, preset="trn1")
    per_block = 128 * WIDTH * 4
    spilled = max(0, n + 1 - get_preset("trn1").sbuf_partition_bytes // (WIDTH * 4))
    prof = bench.profile()
    assert prof["spill_bytes"] == 2 * spilled * per_block
    assert prof["reload_bytes"] == spilled * per_block
    assert bench.kernel.spill_bytes == 2 * spilled * per_block
    assert prof["sbuf_bytes"] <= get_preset("trn1").sbuf_bytes
    if spilled:
        assert prof["spill_ns"] > 0
        rows = spill_rows(bench)
        # reloads are charged to the line that reads the block, on the spill queues
        reload_lines = {r["source"] for r in rows if r["opcode"] == "DmaReload"}
        assert all("kernel_cases.py:" in s for s in reload_lines)
        assert all(int(r["engine"].split(".")[1]) >= 64 for r in rows)
        lines = {lt.source for lt in bench.line_times() if lt.ns.get("dma")}
        assert "acc = nl.add(acc, block)" in lines
    else:
        assert not spill_rows(bench) and prof["spill_ns"] == 0


def test_a_kernel_that_fits_is_timed_as_before(monkeypatch):
    """Declaring the tiles and their accesses changes nothing when they fit."""
    a = blocks(5)
    declared = nki.benchmark(sum_of_loaded, a, preset="trn1")
    monkeypatch.setattr(KernelBuilder, "touch", lambda self, *args, **kwargs: None)
    plain = nki.benchmark(sum_of_loaded, a, preset="trn1")
    assert declared.duration_ns == plain.duration_ns
    assert [r["start_ns"] for r in declared.schedule()] == [r["start_ns"] for r in
                                                             plain.schedule()]


def test_references_past_sbuf_are_no_error_and_no_spill_when_the_tiles_are_dead():
    """Python holds 10 x 32 KiB per partition, but each block is dead after its store."""
    a = blocks(10)
    out = nki.simulate_kernel(references_kept, a, preset="trn1")
    np.testing.assert_array_equal(out, a)
    bench = nki.benchmark(references_kept, a, preset="trn1")
    assert not spill_rows(bench)
    assert bench.profile()["sbuf_bytes"] <= get_preset("trn1").sbuf_bytes


def test_a_spilling_kernel_inside_a_compiled_graph_keeps_its_spills():
    """`torch_op.lower_into` copies the traced kernel into a graph's program: the stores
    and reloads come with it, and the instructions that wait for them still do."""
    from neuron_explorer.backend.hardware import OpSpec, TensorSpec
    from neuron_explorer.nki.torch_op import as_torch_op, lower_into

    as_torch_op(sum_of_loaded, name="sum_of_loaded_spills")
    p = get_preset("trn1")
    shape = (128 * 8, WIDTH)
    b = KernelBuilder(p, "graph")
    before = b.vector("TensorCopy", 512, "float32")  # an op of the graph before the kernel
    b.after = (before,)
    spec = OpSpec("nki::sum_of_loaded_spills", (TensorSpec(shape, "float32"),),
                  (TensorSpec((128, WIDTH), "float32"),))
    assert lower_into(b, spec)
    b.after = ()
    program = b.build()
    alone = nki.benchmark(sum_of_loaded, blocks(8), preset="trn1").kernel
    assert program.spill_bytes == alone.spill_bytes > 0
    assert set(program.opcodes) >= {"DmaSpill", "DmaReload"}
    assert program.duration_ns >= alone.duration_ns
