"""SBUF allocation by live range, and the spills when live tiles exceed a partition's SBUF
(backend/hardware/spills.py): a kernel that fits is left as it was; one that does not
stores and reloads the tiles used furthest ahead, on the spill queues, and waits for them."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from neuron_explorer.backend.hardware import KernelBuilder, get_preset
from neuron_explorer.backend.hardware.kernel import FIRST_DMA, IO_QUEUES
from neuron_explorer.backend.hardware.spills import SbufOverflow

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tutorial_kernels

KIB = 1024
LONG = 32 * KIB  # bytes per partition of each long-lived tile


def long_lived(p, n_long: int, work_bytes: int, declare: bool = True) -> KernelBuilder:
    """`n_long` [128, 32 KiB] tiles loaded first and each read once at the end; in between
    a working tile of `work_bytes` per partition is made on GpSimd and stored. Live at the
    working tile: n_long x 32 KiB + work_bytes per partition."""
    b = KernelBuilder(p, "long_lived")
    tiles = [b.sbuf_tile(LONG, name=f"L{i}") for i in range(n_long)]
    loads = [b.dma_load(128 * LONG, 128) for _ in range(n_long)]
    if declare:
        for t, ids in zip(tiles, loads, strict=True):
            b.touch(t, ids, write=True, whole=True)
    made = b.gpsimd("Iota", 128 * work_bytes // 4, "float32")
    stored = b.dma_store(128 * work_bytes, 128, (made,))
    if declare:
        work = b.sbuf_tile(work_bytes, name="W")
        b.touch(work, (made,), write=True, whole=True)
        b.touch(work, stored)
    for t, ids in enumerate(loads):
        read = b.vector("TensorReduce", LONG // 4, "float32", 1, ids)
        if declare:
            b.touch(tiles[t], (read,))
    return b


def spilled_tiles(p, n_long: int, work_bytes: int) -> int:
    """The closed form: whole tiles leave, as many as the excess needs."""
    excess = n_long * LONG + work_bytes - p.sbuf_partition_bytes
    return max(0, math.ceil(excess / LONG))


def opcode_bytes(kernel, opcode: str) -> int:
    a = kernel.arrays()
    if opcode not in kernel.opcodes:
        return 0
    return int(a["bytes"][a["opcode"] == kernel.opcodes.index(opcode)].sum())


def test_tiles_that_fit_change_nothing():
    p = get_preset("trn1")  # 192 KiB per partition: 5 x 32 + 16 KiB fit
    declared = long_lived(p, 5, 16 * KIB).build()
    plain = long_lived(p, 5, 16 * KIB, declare=False).build()
    assert declared.spill_bytes == 0
    for key in ("engine", "start", "dur", "bytes"):
        assert np.array_equal(declared.arrays()[key], plain.arrays()[key])
    assert declared.duration_ns == plain.duration_ns
    assert declared.sbuf_bytes == 128 * (5 * LONG + 16 * KIB)  # the live-range high-water


@pytest.mark.parametrize(("n_long", "work"), [(6, 16 * KIB), (6, 48 * KIB), (6, 96 * KIB),
                                              (5, 40 * KIB)])
def test_the_excess_spills_whole_tiles_stored_once_and_reloaded_once(n_long, work):
    p = get_preset("trn1")
    kernel = long_lived(p, n_long, work).build()
    n = spilled_tiles(p, n_long, work)
    assert n >= 1
    tile_bytes = 128 * LONG
    assert opcode_bytes(kernel, "DmaSpill") == n * tile_bytes
    assert opcode_bytes(kernel, "DmaReload") == n * tile_bytes
    assert kernel.spill_bytes == 2 * n * tile_bytes
    assert kernel.sbuf_bytes <= 128 * p.sbuf_partition_bytes
    # the traffic counts as HBM traffic, and it costs time
    plain = long_lived(p, n_long, work, declare=False).build()
    assert kernel.hbm_bytes == plain.hbm_bytes + 2 * n * tile_bytes
    assert kernel.duration_ns > plain.duration_ns


def test_the_tiles_used_furthest_ahead_leave_and_their_readers_wait_for_the_reload():
    p = get_preset("trn1")
    b = long_lived(p, 6, 48 * KIB)  # two tiles leave: L5 and L4, read last
    served = b.place_tiles()
    kernel = b.build()
    a = kernel.arrays()
    ops = np.array(kernel.opcodes)[a["opcode"]]
    reload = np.flatnonzero(ops == "DmaReload")
    spill = np.flatnonzero(ops == "DmaSpill")
    assert len(served) == len(reload) + len(spill)  # each added instruction serves one
    reads = np.flatnonzero(ops == "TensorReduce")
    # the reloads serve the last two reads (L4, L5), which start once their data is back
    first_added = len(a["start"]) - len(served)
    assert sorted({served[int(i) - first_added] for i in reload}) == sorted(reads[-2:].tolist())
    end = a["start"] + a["dur"]
    assert a["start"][reads[-1]] >= end[reload].max() - 1
    assert a["start"][reads[0]] < end[reload].min()  # L0 is read before any reload ends
    # the stores and reloads run on their own queues, one of each per DMA engine
    queues = a["engine"][np.r_[spill, reload]] - FIRST_DMA
    assert (queues >= IO_QUEUES).all()
    # the working tile's first write waits for the space the stores free
    made = int(np.flatnonzero(ops == "Iota")[0])
    assert a["start"][made] >= end[spill].max() - 1


def test_a_value_stored_once_is_reloaded_for_each_use_and_a_rewritten_buffer_never():
    p = get_preset("trn1")
    b = KernelBuilder(p, "reread")
    big = b.sbuf_tile(5 * LONG, name="big")  # 160 KiB of the 192
    buf = b.sbuf_tile(48 * KIB, name="buf")  # rewritten each iteration: a new value each
    load = b.dma_load(128 * 5 * LONG, 128)
    b.touch(big, load, write=True, whole=True)
    for _ in range(3):
        made = b.gpsimd("Iota", 128 * 48 * KIB // 4, "float32")
        b.touch(buf, (made,), write=True, whole=True)
        b.touch(buf, b.dma_store(128 * 48 * KIB, 128, (made,)))
        b.touch(big, (b.vector("TensorReduce", 5 * LONG // 4, "float32", 1, load),))
    kernel = b.build()
    # each new buf value pushes big out; big is stored once (never written again) and
    # reloaded for each of its three reads; buf's values die at their store, never spilled
    assert opcode_bytes(kernel, "DmaSpill") == 128 * 5 * LONG
    assert opcode_bytes(kernel, "DmaReload") == 3 * 128 * 5 * LONG


def test_operands_of_one_instruction_past_sbuf_are_an_error():
    p = get_preset("trn1")
    b = KernelBuilder(p, "too_wide")
    tiles = [b.sbuf_tile(LONG) for _ in range(7)]  # 224 KiB read by one instruction
    loads = [b.dma_load(128 * LONG, 128) for _ in tiles]
    for t, ids in zip(tiles, loads, strict=True):
        b.touch(t, ids, write=True, whole=True)
    read = b.vector("TensorTensor", LONG // 4, "float32", 2, [i for ids in loads for i in ids])
    for t in tiles:
        b.touch(t, (read,))
    with pytest.raises(SbufOverflow, match="SBUF overflow"):
        b.build()


def test_mamba_v2_spills_at_seq_8192_and_v3_does_not():
    """AWS's profiles: v2 at seq_len 8192 has spill and reload DMA queues and its VectorE
    is active 58.93% of the kernel; v3 (seq_len tiled by 512) has neither, 94.85%."""
    p = get_preset("trn1")
    v2 = tutorial_kernels.mamba(p, "v2", 4096, 8192)
    v3 = tutorial_kernels.mamba(p, "v3", 4096, 8192)
    assert v2.spill_bytes > 0 and v3.spill_bytes == 0
    assert v2.engine_busy_ns["vector"] / v2.duration_ns == pytest.approx(0.5893, abs=0.08)
    assert v3.engine_busy_ns["vector"] / v3.duration_ns > 0.9
    assert v2.duration_ns > 1.4 * v3.duration_ns  # measured: 52.2 / 27.8 ms
    # seq_len 4096 fits (the scaling table's v2 column holds its 1.3x of v3 there)
    assert tutorial_kernels.mamba(p, "v2", 4096, 4096).spill_bytes == 0
