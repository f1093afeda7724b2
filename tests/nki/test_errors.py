"""The done-when's error list, in the forms test_language.py leaves out: each error is
one NkiError naming the kernel's line, the thing and the fix, eager calls included."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from neuron_explorer import nki
from neuron_explorer.nki import isa as nisa
from neuron_explorer.nki import language as nl


def line_of(func, text: str) -> str:
    lines, first = inspect.getsourcelines(func)
    return f"test_errors.py:{first + next(i for i, s in enumerate(lines) if text in s)}"


@nki.jit
def load_256_partitions(x):
    return nl.load(x[0:256, :])


@nki.jit
def half_written(x):
    t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    t[:, 0:4] = nl.load(x[:, 0:4])
    return nl.exp(t)


@nki.jit
def contraction_mismatch(x, y):
    return nl.matmul(nl.load(x), nl.load(y), transpose_x=True)


@nki.jit
def store_mismatch(x):
    out = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return out


@nki.jit
def psum_matmul_into_bf16(x):
    acc = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
    t = nl.load(x)
    nisa.nc_matmul(dst=acc, stationary=t, moving=t)
    return acc


@nki.jit
def one_huge_tile(x):
    return nl.zeros((128, 300_000), dtype=nl.float32, buffer=nl.sbuf)


CASES = [
    (load_256_partitions, (np.ones((256, 4), np.float32),), "nl.load(x[0:256",
     r"partition dimension.*256"),
    (half_written, (np.ones((128, 8), np.float32),), "nl.exp(t)", "read before it is written"),
    (contraction_mismatch, (np.ones((128, 64), np.float32), np.ones((64, 512), np.float32)),
     "nl.matmul(", "contraction|mismatch"),
    (store_mismatch, (np.ones((128, 6), np.float32),), "nl.store(out", "mismatch"),
    (psum_matmul_into_bf16, (np.ones((128, 128), np.float32),), "nisa.nc_matmul(",
     "float32"),
    (one_huge_tile, (np.ones((1, 1), np.float32),), "nl.zeros((128, 300_000)",
     r"SBUF overflow.*needs 1200000 B per partition"),
]


@pytest.mark.parametrize(("kernel", "args", "text", "message"), CASES,
                         ids=[c[0].__name__ for c in CASES])
def test_each_error_names_the_line(kernel, args, text, message):
    with pytest.raises(nki.NkiError, match=message) as info:
        nki.simulate_kernel(kernel, *args)
    assert str(info.value).startswith(line_of(kernel.func, text) + ":"), str(info.value)
    assert "\n" not in str(info.value)  # one line


def test_an_eager_call_reports_the_kernel_line_not_a_deep_traceback():
    x = torch.ones(256, 4).to("neuron")
    with pytest.raises(nki.NkiError) as info:
        load_256_partitions(x)
    assert str(info.value).startswith(line_of(load_256_partitions.func, "nl.load(x[0:256"))
