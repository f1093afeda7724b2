"""neuron_explorer.nki: every construct's numbers against numpy/torch, the errors
(each naming the kernel line), dependencies and per-line timing."""

from __future__ import annotations

import inspect

import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import numpy as np
import pytest
import torch
from neuron_explorer import nki

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def line_of(func, text: str) -> str:
    """'file:line' of the first line of `func` containing `text`."""
    lines, first = inspect.getsourcelines(func)
    for i, src in enumerate(lines):
        if text in src:
            return f"test_language.py:{first + i}"
    raise AssertionError(text)


@nki.jit
def elementwise(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    r = nl.exp(a) + nl.tanh(b) * 2.0 - nl.maximum(a, b) / (nl.sigmoid(b) + 1.0)
    r = r + nl.gelu(a) + nl.silu(b) + nl.rsqrt(nl.abs(a) + 1.0) + nl.sqrt(nl.abs(b))
    r = r + nl.reciprocal(nl.abs(a) + 2.0) + nl.relu(b) - nl.square(a) * 0.25
    nl.store(out, value=r)
    return out


def test_elementwise_arithmetic_and_activations_match_torch():
    x, y = rand(128, 64), rand(128, 64)
    a, b = torch.from_numpy(x), torch.from_numpy(y)
    expected = (a.exp() + b.tanh() * 2 - torch.maximum(a, b) / (b.sigmoid() + 1)
                + torch.nn.functional.gelu(a) + torch.nn.functional.silu(b)
                + torch.rsqrt(a.abs() + 1) + b.abs().sqrt() + 1 / (a.abs() + 2)
                + b.relu() - a.square() * 0.25)
    out = nki.simulate_kernel(elementwise, x, y)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


@nki.jit
def reductions(x):
    s = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    m = nl.ndarray((x.shape[0],), dtype=x.dtype, buffer=nl.shared_hbm)
    mu = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(s, nl.sum(t, axis=1, keepdims=True))
    nl.store(m, nl.max(t, axis=1))
    nl.store(mu, nisa.tensor_reduce(op=nl.add, data=t, axis=1, keepdims=True) * (1 / 96))
    return s, m, mu


def test_reductions_over_the_free_axis():
    x = rand(100, 96)
    s, m, mu = nki.simulate_kernel(reductions, x)
    np.testing.assert_allclose(s, x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, x.max(1))
    np.testing.assert_allclose(mu, x.mean(1, keepdims=True), rtol=1e-5, atol=1e-6)


@nki.jit
def softmax_rows(x):
    """Row softmax with masks for a row count that is not a multiple of 128."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows, cols = x.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(cols)[None, :]
    for t in nl.affine_range((rows + 127) // 128):
        mask = t * 128 + i_p < rows
        tile = nl.load(x[t * 128 + i_p, i_f], mask=mask)
        shifted = nl.exp(tile - nl.max(tile, axis=1, keepdims=True))
        total = nl.sum(shifted, axis=1, keepdims=True)
        probs = nisa.tensor_scalar(data=shifted, op0=nl.multiply,
                                   operand0=nl.reciprocal(total))
        nl.store(out[t * 128 + i_p, i_f], value=probs, mask=mask)
    return out


def test_masked_loads_and_stores_with_arange_indices():
    x = rand(200, 48)
    out = nki.simulate_kernel(softmax_rows, x)
    np.testing.assert_allclose(out, torch.softmax(torch.from_numpy(x), 1).numpy(),
                               rtol=1e-5, atol=1e-6)


@nki.jit
def layouts(x, w):
    """nl.matmul both ways, nl.transpose, nisa.nc_transpose, mgrid, casts, iota."""
    mm = nl.ndarray((x.shape[0], w.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    xt_out = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
    cast = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    idx = nl.ndarray((x.shape[0], 1), dtype=nl.int32, buffer=nl.shared_hbm)
    ix = nl.mgrid[0:x.shape[0], 0:x.shape[1]]
    xs = nl.load(x[ix.p, ix.x])
    ws = nl.load(w)
    acc = nl.zeros((x.shape[0], w.shape[1]), nl.float32, buffer=nl.psum)
    acc += nl.matmul(xs, ws)  # x [M, K]: transposed on the Tensor Engine first
    acc += nl.matmul(nl.transpose(xs), ws, transpose_x=True)
    nl.store(mm, nl.copy(acc))
    nl.store(xt_out, nl.copy(nisa.nc_transpose(xs)))
    nl.store(cast, nl.copy(xs, dtype=nl.bfloat16))
    nl.store(idx, nisa.iota(nl.arange(x.shape[0])[:, None] * 3, dtype=nl.int32))
    return mm, xt_out, cast, idx


def test_matmul_transpose_casts_and_iota():
    x, w = rand(64, 32), rand(64, 48)[:32]
    mm, xt, cast, idx = nki.simulate_kernel(layouts, x, w)
    np.testing.assert_allclose(mm, 2 * (x @ w), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(xt, x.T)
    bf16 = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(cast, bf16)
    np.testing.assert_array_equal(idx[:, 0], np.arange(64) * 3)


@nki.jit
def isa_ops(x, bias):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    b = nl.load(bias)
    act = nisa.activation(op=nl.exp, data=t, bias=b, scale=0.5)
    two = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=two, value=2.0)
    prod = nisa.tensor_tensor(data1=act, data2=two, op=nl.multiply)
    res = nisa.tensor_scalar(data=prod, op0=nl.subtract, operand0=1.0, op1=nl.maximum,
                             operand1=0.0)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_isa_instructions():
    x, bias = rand(128, 40), rand(128, 1)
    out = nki.simulate_kernel(isa_ops, x, bias)
    np.testing.assert_allclose(out, np.maximum(np.exp(x * 0.5 + bias) * 2 - 1, 0), rtol=1e-6)


@nki.jit
def psum_accumulates(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(a.shape[0] // 128):
        nisa.nc_matmul(dst=acc, stationary=nl.load(a[k * 128:(k + 1) * 128, :]),
                       moving=nl.load(b[k * 128:(k + 1) * 128, :]))
    nl.store(out, nl.copy(acc))
    return out


def test_matmul_results_accumulate_in_psum_bf16_exactly_rounded_once():
    a, b = rand(384, 128), rand(384, 256)
    a16 = torch.from_numpy(a).bfloat16()
    b16 = torch.from_numpy(b).bfloat16()
    out = nki.simulate_kernel(psum_accumulates, a16.float().numpy(), b16.float().numpy())
    np.testing.assert_allclose(out, (a16.float().T @ b16.float()).numpy(), rtol=1e-5,
                               atol=1e-4)


# --- errors ------------------------------------------------------------------------
@nki.jit
def too_many_partitions(x):
    return nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def sbuf_overflow(x):
    # one tile larger than a partition's SBUF (live tiles past it spill instead)
    return nl.ndarray((128, 65536), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def psum_overflow(x):
    keep = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
    return keep


@nki.jit
def read_before_write(x):
    t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    return nl.exp(t)


@nki.jit
def int_matmul(x):
    t = nl.load(x)
    return nl.matmul(t, t, transpose_x=True)


@nki.jit
def mismatched(x, y):
    return nl.add(nl.load(x), nl.load(y))


@nki.jit
def dma_cast(x):
    t = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)


@pytest.mark.parametrize("kernel, args, text, message", [
    (too_many_partitions, (rand(4, 4),), "nl.ndarray((256", "partition dimension 256"),
    (sbuf_overflow, (rand(4, 4),), "nl.ndarray((128, 65536)", "SBUF overflow"),
    (psum_overflow, (rand(4, 4),), "nl.ndarray((128, 512)", "PSUM overflow"),
    (read_before_write, (rand(4, 4),), "nl.exp(t)", "read before it is written"),
    (int_matmul, (np.ones((128, 4), np.int32),), "nl.matmul(t, t", "cannot take int32"),
    (mismatched, (rand(128, 4), rand(128, 6)), "nl.add(", "shape mismatch"),
    (dma_cast, (rand(4, 4),), "nisa.dma_copy(dst=t", "cannot convert dtypes"),
])
def test_errors_name_the_kernel_line(kernel, args, text, message):
    with pytest.raises(nki.NkiError, match=message) as info:
        nki.simulate_kernel(kernel, *args)
    assert str(info.value).startswith(line_of(kernel.func, text) + ":")


def test_a_language_call_outside_a_kernel_says_how_to_run_it():
    with pytest.raises(nki.NkiError, match="inside an @nki.jit kernel"):
        nl.load(np.zeros((4, 4)))


# --- scheduling and per-line time ----------------------------------------------------
@nki.jit
def two_independent_streams(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)                       # DMA
    b = nl.exp(a)                        # Scalar waits for the load of a only
    c = nl.load(y)                       # DMA, independent of the Scalar work
    d = nl.multiply(c, 3.0)              # Vector waits for c only
    nl.store(out, value=b + d)
    return out


def test_instructions_wait_only_for_the_tiles_they_read_and_carry_their_line():
    x = rand(128, 2048)
    bench = nki.benchmark(two_independent_streams, x, x, numerics=True)
    np.testing.assert_allclose(bench.outputs, np.exp(x) + 3 * x, rtol=1e-6)
    rows = bench.schedule()
    exp_row = next(r for r in rows if r["engine"] == "scalar")
    mul_row = next(r for r in rows if r["opcode"] == "TensorScalar")
    loads = [r for r in rows if r["opcode"] == "DmaLoad"]
    load_a = [r for r in loads if r["source"] == line_of(two_independent_streams.func,
                                                          "a = nl.load")]
    load_c = [r for r in loads if r["source"] == line_of(two_independent_streams.func,
                                                          "c = nl.load")]
    assert load_a and load_c
    assert exp_row["start_ns"] >= max(r["start_ns"] + r["dur_ns"] for r in load_a)
    # both loads run concurrently; the exp does not wait for the second load
    assert min(r["start_ns"] for r in load_c) < exp_row["start_ns"]
    assert mul_row["start_ns"] >= max(r["start_ns"] + r["dur_ns"] for r in load_c)
    by_line = {lt.location: lt for lt in bench.line_times()}
    exp_line = by_line[line_of(two_independent_streams.func, "b = nl.exp")]
    assert set(exp_line.ns) == {"scalar"} and exp_line.ns["scalar"] > 0
    assert "nl.exp" in exp_line.source
    assert sum(lt.total_ns for lt in bench.line_times()) == sum(
        r["dur_ns"] for r in rows)


def test_buffers_are_reused_only_after_their_readers_finish():
    """Memory that is full makes a new tile wait for the last reader of the tile whose
    space it takes (write after read through buffer reuse)."""
    @nki.jit
    def stream(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.exp(t))
        return out

    x = rand(128 * 6, 64)
    np.testing.assert_allclose(nki.simulate_kernel(stream, x), np.exp(x), rtol=1e-6)

    class Shape:  # 96 KiB per partition per tile: two fit in trn2's 224 KiB
        shape, dtype = (128 * 6, 24576), "float32"

    rows = nki.benchmark(stream, Shape()).schedule()
    loads = [r for r in rows if r["opcode"] == "DmaLoad"]
    exps = [r for r in rows if r["opcode"] == "Activation"]
    per_load = len(loads) // 6
    third_load_start = min(r["start_ns"] for r in loads[2 * per_load:3 * per_load])
    assert third_load_start >= exps[0]["start_ns"] + exps[0]["dur_ns"]


@nki.jit
def blocked_buffer(x):
    """A [4, par_dim(128), 64] SBUF buffer: block dims before the partition dim."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((4, nl.par_dim(nl.tile_size.pmax), x.shape[1]), dtype=x.dtype,
                     buffer=nl.sbuf)
    for i in nl.static_range(4):
        nisa.dma_copy(dst=buf[i], src=x[i * 128:(i + 1) * 128, :])
    for i in nl.sequential_range(4):
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.negative(buf[i]))
    return out


def test_par_dim_buffers_index_by_block():
    x = rand(512, 64)
    np.testing.assert_array_equal(nki.simulate_kernel(blocked_buffer, x), -x)


@nki.jit
def bf16_psum(a):
    acc = nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.psum)
    t = nl.load(a)
    nisa.nc_matmul(dst=acc, stationary=t, moving=t)


@nki.jit
def whole_blocked_buffer(x):
    buf = nl.zeros((2, nl.par_dim(128), 4), dtype=nl.float32, buffer=nl.sbuf)
    return nl.exp(buf)


@pytest.mark.parametrize("kernel, text, message", [
    (bf16_psum, "nisa.nc_matmul(dst=acc", "land in PSUM as float32"),
    (whole_blocked_buffer, "nl.exp(buf)", "partition dimension .* must be the first"),
])
def test_more_errors_name_the_line(kernel, text, message):
    with pytest.raises(nki.NkiError, match=message) as info:
        nki.simulate_kernel(kernel, rand(128, 4))
    assert str(info.value).startswith(line_of(kernel.func, text) + ":")


UNARY = {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
         "relu": torch.relu, "gelu": torch.nn.functional.gelu,
         "gelu_apprx_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
         "silu": torch.nn.functional.silu, "softplus": torch.nn.functional.softplus,
         "rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "reciprocal": torch.reciprocal,
         "square": torch.square, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos,
         "sign": torch.sign, "abs": torch.abs, "negative": torch.neg}
BINARY = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
          "maximum": torch.maximum, "minimum": torch.minimum, "power": torch.pow,
          "equal": torch.eq, "not_equal": torch.ne, "greater": torch.gt,
          "greater_equal": torch.ge, "less": torch.lt, "less_equal": torch.le}
REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "mean": torch.mean,
          "prod": torch.prod}


def _one_op(kind: str, name: str):
    fn = getattr(nl, name)

    @nki.jit
    def kernel(x, y):
        out_shape = (x.shape[0], 1) if kind == "reduce" else x.shape
        out = nl.ndarray(out_shape, dtype=nl.float32, buffer=nl.shared_hbm)
        a, b = nl.load(x), nl.load(y)
        if kind == "unary":
            r = fn(a)
        elif kind == "binary":
            r = fn(a, b, dtype=nl.float32)
        else:
            r = fn(a, axis=1, keepdims=True)
        nl.store(out, value=r)
        return out
    return kernel


@pytest.mark.parametrize("kind, name", [("unary", n) for n in UNARY]
                         + [("binary", n) for n in BINARY] + [("reduce", n) for n in REDUCE])
def test_every_operator_matches_torch(kind, name):
    x = np.abs(rand(128, 16)) + 0.5 if name in ("log", "rsqrt", "sqrt", "power") else rand(128, 16)
    y = rand(128, 16)
    y[:, :4] = x[:, :4]  # some equal elements for the comparisons
    out = nki.simulate_kernel(_one_op(kind, name), x, y)
    a, b = torch.from_numpy(x), torch.from_numpy(y)
    if kind == "unary":
        ref = UNARY[name](a)
    elif kind == "binary":
        ref = BINARY[name](a, b).float()
    else:
        ref = REDUCE[name](a, 1, keepdim=True)
    np.testing.assert_allclose(out, ref.numpy(), rtol=2e-5, atol=1e-6, equal_nan=True)


@nki.jit
def creation_and_copies(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    copy = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=copy, src=x)  # HBM -> HBM
    t = nl.load(copy, dtype=nl.bfloat16)
    filled = nl.full(x.shape, 3.0, nl.float32) + nl.ones(x.shape, nl.float32)
    nl.store(out, value=nl.zeros_like(t, dtype=nl.float32) + t + filled)
    return out


def test_creation_hbm_copies_and_load_casts():
    x = rand(128, 32)
    bf16 = torch.from_numpy(x).bfloat16().float().numpy()
    np.testing.assert_array_equal(nki.simulate_kernel(creation_and_copies, x), bf16 + 4.0)


@nki.jit
def store_from_psum(x):
    out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, value=nisa.nc_matmul(t, t))


def test_storing_a_psum_tile_says_to_copy_it_out():
    with pytest.raises(nki.NkiError, match=r"copy it out first") as info:
        nki.simulate_kernel(store_from_psum, rand(128, 4))
    assert str(info.value).startswith(line_of(store_from_psum.func, "nl.store(out") + ":")


def test_a_kernel_runs_with_the_cyclic_collector_paused_and_restores_it():
    """A kernel's instructions, tiles and views accumulate until it ends: the collector
    would walk them again and again (15% of a large GEMM's scheduling). It is back on
    after the kernel, also after one that raises."""
    import gc

    seen = []

    @nki.jit
    def copy(x):
        seen.append(gc.isenabled())
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out

    @nki.jit
    def fails(x):
        seen.append(gc.isenabled())
        raise ValueError("in the kernel")

    x = rand(128, 8)
    assert gc.isenabled()
    np.testing.assert_array_equal(nki.simulate_kernel(copy, x), x)
    assert gc.isenabled()
    with pytest.raises(ValueError, match="in the kernel"):
        nki.simulate_kernel(fails, x)
    assert seen == [False, False] and gc.isenabled()
