"""Small NKI kernels that each show (or avoid) one thing the kernel rules look for,
recorded into one engine-level trace."""

from __future__ import annotations

import neuron_explorer
import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import torch
from neuron_explorer import nki

TILES, WIDTH = 8, 2048


def _heavy(x):
    """Enough Scalar/Vector work per tile to match its load."""
    for _ in range(3):
        x = nl.tanh(nl.multiply(x, 0.5))
    return x


@nki.jit
def serial(a):
    """One SBUF buffer for every tile: each load waits for the compute of the last one."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((128, WIDTH), dtype=a.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(TILES):
        nisa.dma_copy(dst=buf, src=a[t * 128:(t + 1) * 128, :])
        nl.store(out[t * 128:(t + 1) * 128, :], value=nl.add(_heavy(buf), buf))
    return out


@nki.jit
def pipelined(a):
    """The same work with a tile allocated per iteration: loads run ahead of compute."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(TILES):
        x = nl.load(a[t * 128:(t + 1) * 128, :])
        nl.store(out[t * 128:(t + 1) * 128, :], value=nl.add(_heavy(x), x))
    return out


@nki.jit
def narrow_matmul(lhsT, rhs):
    """K = 32 partitions and M = 32 columns: a sixteenth of the array."""
    out = nl.ndarray((lhsT.shape[1], rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(lhsT)
    for j in nl.affine_range(rhs.shape[1] // 512):
        y = nl.load(rhs[:, j * 512:(j + 1) * 512])
        for _ in range(16):
            p = nl.matmul(x, y, transpose_x=True)
        nl.store(out[:, j * 512:(j + 1) * 512], value=nl.copy(p))
    return out


@nki.jit
def streaming(a, b):
    """relu(2a + b) over [128, 1024] tiles: its transfers keep HBM near its peak rate, each
    longer than a queue alone would take (the queues share the engines), which once read as
    68% overhead."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(a.shape[0] // 128):
        x = nl.load(a[t * 128:(t + 1) * 128, :])
        y = nl.load(b[t * 128:(t + 1) * 128, :])
        nl.store(out[t * 128:(t + 1) * 128, :], value=nl.relu(nl.add(nl.multiply(x, 2.0), y)))
    return out


@nki.jit
def tiny_loads(a):
    """[128, 8] tiles: every transfer is almost all fixed cost."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for j in nl.affine_range(a.shape[1] // 8):
        x = nl.load(a[:, j * 8:(j + 1) * 8])
        nl.store(out[:, j * 8:(j + 1) * 8], value=x)
    return out


@nki.jit
def big_sbuf(a):
    """A [128, 50000] fp32 tile: about 87% of a trn2 partition's 224 KiB."""
    out = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.shared_hbm)
    hold = nl.zeros((128, 50000), dtype=nl.float32, buffer=nl.sbuf)
    x = nl.load(a)
    nl.store(out, value=nl.add(x, hold[:, 0:512]))
    return out


@nki.jit
def spilling(a):
    """Eight [128, 8192] fp32 blocks loaded, then summed: with the sum, 9 x 32 KiB per
    partition live, 2 blocks more than a trn2 partition's 224 KiB."""
    out = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    blocks = [nl.load(a[t * 128:(t + 1) * 128, :]) for t in range(a.shape[0] // 128)]
    acc = nl.add(blocks[0], blocks[1])
    for block in blocks[2:]:
        acc = nl.add(acc, block)
    nl.store(out, value=acc)
    return out


@nki.jit
def full_matmul(lhsT, rhs):
    """[128, 128] stationary tiles, 512 moving columns: the whole array."""
    out = nl.ndarray((128, rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(lhsT)
    for j in nl.affine_range(rhs.shape[1] // 512):
        y = nl.load(rhs[:, j * 512:(j + 1) * 512])
        p = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        for _ in range(8):
            p += nl.matmul(x, y, transpose_x=True)
        nl.store(out[:, j * 512:(j + 1) * 512], value=nl.copy(p))
    return out


def record(path) -> neuron_explorer.Trace:
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to("neuron")

    with neuron_explorer.record(path, level="engine", quiet=True):
        a = randn(TILES * 128, WIDTH)
        serial(a)
        pipelined(a)
        narrow_matmul(randn(32, 32), randn(32, 1024))
        tiny_loads(randn(128, 512))
        streaming(randn(1024, 1024), randn(1024, 1024))
        big_sbuf(randn(128, 512))
        full_matmul(randn(128, 128).bfloat16(), randn(128, 2048).bfloat16())
        spilling(randn(8 * 128, 8192))
        torch.neuron.synchronize()
        neuron_explorer.step()
    return neuron_explorer.load(path)
