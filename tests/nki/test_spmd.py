"""SPMD launch grids: `kernel[grid](...)` runs one program per grid point, each with its
`nl.program_id(axis)`, all writing the shared HBM outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from neuron_explorer import nki
from neuron_explorer.nki import language as nl


@nki.jit
def add_blocks(a, b):
    """Program (i, j) adds the block of rows i and columns j of a grid over a and b."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = a.shape[0] // nl.num_programs(0)
    cols = a.shape[1] // nl.num_programs(1)
    r0, c0 = nl.program_id(0) * rows, nl.program_id(1) * cols
    for t in nl.affine_range(rows // 128):
        r = r0 + t * 128
        x = nl.load(a[r:r + 128, c0:c0 + cols])
        y = nl.load(b[r:r + 128, c0:c0 + cols])
        nl.store(out[r:r + 128, c0:c0 + cols], value=x + y)
    return out


@nki.jit
def ids(a):
    """Each program writes 10 * program_id(0) + program_id(1) into its own row."""
    out = nl.zeros((nl.num_programs(0) * nl.num_programs(1), 1), dtype=nl.float32,
                   buffer=nl.shared_hbm)
    row = nl.program_id(0) * nl.num_programs(1) + nl.program_id(1)
    tile = nl.full((1, 1), 10 * nl.program_id(0) + nl.program_id(1), dtype=nl.float32)
    nl.store(out[row:row + 1, :], value=tile)
    return out


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((512, 256), dtype=np.float32),
            rng.standard_normal((512, 256), dtype=np.float32))


def test_every_program_writes_its_part_of_the_shared_output():
    a, b = _inputs()
    np.testing.assert_array_equal(nki.simulate_kernel(add_blocks[2, 2], a, b), a + b)
    np.testing.assert_array_equal(nki.simulate_kernel(add_blocks[4, 1], a, b), a + b)


def test_program_ids_cover_the_grid_and_zeros_are_filled_once():
    out = nki.simulate_kernel(ids[3, 2], np.zeros((1, 1), np.float32))
    expected = np.array([[10 * i + j] for i in range(3) for j in range(2)], np.float32)
    np.testing.assert_array_equal(out, expected)


def test_a_plain_call_is_one_program():
    a, b = _inputs()
    grid_free = nki.benchmark(add_blocks[1, 1], a, b)
    np.testing.assert_array_equal(nki.simulate_kernel(add_blocks[1, 1], a, b), a + b)
    with pytest.raises(nki.NkiError, match=r"without a launch grid.*kernel\[n, m\]"):
        nki.simulate_kernel(add_blocks, a, b)  # asks for axis 1
    assert grid_free.duration_ns > 0


def test_the_programs_share_one_core_and_overlap_on_it():
    """Four independent programs: the same instructions as one program doing it all, with
    loads of one program under the adds of another."""
    a, b = _inputs()
    four = nki.benchmark(add_blocks[4, 1], a, b)
    assert len(four.kernel) == len(nki.benchmark(add_blocks[1, 1], a, b).kernel)
    assert four.profile()["dma_compute_overlap_pct"] > 0


def test_a_grid_runs_eager_on_neuron_tensors():
    a, b = (torch.from_numpy(x) for x in _inputs())
    out = add_blocks[2, 2](a.to("neuron"), b.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a + b, rtol=0, atol=0)


@pytest.mark.parametrize("grid", [0, -1, "2", (2, 0), 2.0])
def test_a_bad_grid_says_what_a_grid_is(grid):
    with pytest.raises(nki.NkiError, match="positive ints"):
        add_blocks[grid]


def test_an_axis_past_the_grid_names_the_line():
    @nki.jit
    def third_axis(a):
        return nl.program_id(2)

    with pytest.raises(nki.NkiError, match=r"test_spmd.py:\d+.*grid \[2, 2\] has axes 0..1"):
        nki.simulate_kernel(third_axis[2, 2], np.zeros((1, 1), np.float32))


def test_programs_that_allocate_different_outputs_are_refused():
    @nki.jit
    def uneven(a):
        return nl.ndarray((128, 8 * (1 + nl.program_id(0))), dtype=nl.float32,
                          buffer=nl.shared_hbm)

    with pytest.raises(nki.NkiError, match="every program must allocate the same outputs"):
        nki.benchmark(uneven[2], np.zeros((1, 1), np.float32))
