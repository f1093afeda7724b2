"""`neuron_explorer.nki.language` (`nl`): NKI's tile-level language.

Names and semantics follow AWS's NKI documentation (nki.language). Elementwise math
runs on the Scalar Engine (activation), tile-tile and tile-scalar arithmetic,
reductions and copies on the Vector Engine, matmul and transpose on the Tensor
Engine; results land in SBUF (matmul: PSUM).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from neuron_explorer.nki import dtypes, ops
from neuron_explorer.nki.dtypes import (  # noqa: F401 - NKI's dtype names
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e5m2,
    float16,
    float32,
    int8,
    int16,
    int32,
    uint8,
    uint16,
    uint32,
)
from neuron_explorer.nki.errors import NkiError
from neuron_explorer.nki.tensor import HBM, PSUM, SBUF, Tensor, View, par_dim  # noqa: F401
from neuron_explorer.nki.trace import current, where

# buffers
sbuf = SBUF
psum = PSUM
hbm = HBM
shared_hbm = HBM
private_hbm = HBM

tile_size = SimpleNamespace(pmax=128, psum_fmax=512, gemm_stationary_fmax=128,
                            gemm_moving_fmax=512, bn_stats_fmax=512, psum_min_size=128)


# --- creation ------------------------------------------------------------------------
def ndarray(shape, dtype, buffer: str = SBUF, name: str | None = None) -> Tensor:
    """An uninitialised tensor in `buffer` (reading it before writing is an error)."""
    trace = current("nl.ndarray")
    at = where()
    if _buffer(buffer) == HBM:
        return trace.hbm_tensor(lambda: Tensor(shape, dtype, HBM, name=name, at=at),
                                _dims(shape), dtypes.normalize(dtype), at)[0]
    return Tensor(shape, dtype, buffer, name=name, at=at)


def zeros(shape, dtype, buffer: str = SBUF, name: str | None = None) -> Tensor:
    return full(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer: str = SBUF, name: str | None = None) -> Tensor:
    return full(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer: str = SBUF, name: str | None = None) -> Tensor:
    trace = current("nl.full")
    at = where()
    if _buffer(buffer) == HBM:
        t, new = trace.hbm_tensor(lambda: Tensor(shape, dtype, HBM, name=name, at=at),
                                  _dims(shape), dtypes.normalize(dtype), at)
        if new:  # filled once, by the first program
            t.view().store(np.full(t.shape, fill_value, np.float32))
        ops.finish(trace)
        return t
    t = Tensor(shape, dtype, buffer, name=name, at=at)
    for block in np.ndindex(*t.shape[:t.partition_axis]):  # one memset per block
        ops.engine_op("vector", "Memset", t[block] if block else t.view(), (),
                      lambda: np.float32(fill_value), at)
    ops.finish(trace)
    return t


def zeros_like(x, dtype=None, buffer: str | None = None) -> Tensor:
    v = ops.view_of(x, where())
    return zeros(v.shape, dtype or v.dtype, buffer or v.buffer)


def _dims(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))


def _buffer(buffer) -> str:
    if buffer not in (SBUF, PSUM, HBM):
        raise NkiError(f"unknown buffer {buffer!r}: use nl.sbuf, nl.psum or nl.shared_hbm",
                       where())
    return buffer


# --- loops and indices ---------------------------------------------------------------
def affine_range(*args) -> range:
    """Iterations with no loop-carried dependency (the compiler may overlap them; here
    they overlap as far as their tiles' dependencies allow)."""
    return range(*args)


def sequential_range(*args) -> range:
    """Iterations that depend on each other (through the tiles they share)."""
    return range(*args)


def static_range(*args) -> range:
    """Fully unrolled iterations."""
    return range(*args)


def arange(*args) -> np.ndarray:
    """An index vector: `i_p = nl.arange(128)[:, None]`."""
    return np.arange(*args)


class _Grid(tuple):
    @property
    def p(self) -> np.ndarray:
        return self[0]

    @property
    def x(self) -> np.ndarray:
        return self[1]

    @property
    def y(self) -> np.ndarray:
        return self[2]


class _MGrid:
    """`i_p, i_f = nl.mgrid[0:128, 0:512]` (open grid: each broadcasts over the other)."""

    def __getitem__(self, key) -> _Grid:
        return _Grid(np.ogrid[key] if isinstance(key, tuple) else (np.ogrid[key],))


mgrid = _MGrid()


def program_id(axis: int = 0) -> int:
    """The running program's index along `axis` of the launch grid (`kernel[4, 2](...)`)."""
    trace = current("nl.program_id")
    return trace.program[_grid_axis(trace, axis, "program_id")] if trace.grid else \
        _no_grid(axis, "program_id")


def num_programs(axis: int = 0) -> int:
    """The launch grid's size along `axis`."""
    trace = current("nl.num_programs")
    return trace.grid[_grid_axis(trace, axis, "num_programs")] if trace.grid else \
        _no_grid(axis, "num_programs") + 1


def program_ndim() -> int:
    """How many axes the launch grid has (0 for a plain call)."""
    return len(current("nl.program_ndim").grid)


def _grid_axis(trace, axis: int, api: str) -> int:
    if not isinstance(axis, int) or not 0 <= axis < len(trace.grid):
        raise NkiError(f"nl.{api}({axis!r}): the launch grid {list(trace.grid)} has axes "
                       f"0..{len(trace.grid) - 1}", where())
    return axis


def _no_grid(axis: int, api: str) -> int:
    """A plain call is one program: index 0 (size 1) along axis 0."""
    if axis != 0:
        raise NkiError(f"nl.{api}({axis!r}): the kernel was called without a launch grid "
                       "(one program, axis 0 only); launch it as kernel[n, m](...)", where())
    return 0


# --- memory --------------------------------------------------------------------------
def load(src, mask=None, dtype=None) -> Tensor:
    """HBM -> SBUF: a new SBUF tile holding `src` (masked-out elements hold 0)."""
    trace = current("nl.load")
    at = where()
    v = ops.view_of(src, at)
    if v.buffer != HBM:
        raise NkiError(f"nl.load reads HBM, but {v.tensor.describe()} is on chip", at)
    out = Tensor(v.shape, v.dtype, SBUF, at=at)
    m = None if mask is None else np.broadcast_to(np.asarray(mask, bool), v.shape)
    ops.dma(out.view(), v, at, m)
    if m is not None:  # the masked-out part holds zeros, so later reads are defined
        assert out.written is not None  # a new tile tracks what is written
        out.written[...] = True
    if dtype is not None and dtypes.normalize(dtype) != v.dtype:
        out = copy(out, dtype=dtype)
    ops.finish(trace)
    return out


def store(dst, value, mask=None) -> None:
    """SBUF -> HBM."""
    trace = current("nl.store")
    at = where()
    d = ops.view_of(dst, at)
    if d.buffer != HBM:
        raise NkiError(f"nl.store writes HBM, but {d.tensor.describe()} is on chip", at)
    v = ops.view_of(value, at)
    if v.buffer == PSUM:
        raise NkiError("nl.store writes an SBUF tile, but the value is in PSUM: copy it out "
                       "first (nl.copy(tile, dtype=...))", at)
    if v.dtype != d.dtype:
        v = copy(v, dtype=d.dtype).view()
    m = None if mask is None else np.broadcast_to(np.asarray(mask, bool), d.shape)
    ops.dma(d, v, at, m)
    ops.finish(trace)


# --- arithmetic ----------------------------------------------------------------------
class Op:
    """An NKI operator: callable on tiles (nl.add(a, b)) and usable as `op=` of nisa."""

    def __init__(self, name: str, fn, arity: int, engine: str = "vector") -> None:
        self.__name__ = self.name = name
        self.np = fn
        self.arity = arity
        self.engine = engine

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args, dtype=None, mask=None, **kwargs):
        if self.arity == 1:
            return _unary(self, args[0], dtype)
        return _binary(self, args[0], args[1], dtype)


def _torch(fn):
    def apply(x):
        return fn(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()
    return apply


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _binary(op: Op, a, b, dtype) -> Tensor:
    trace = current(f"nl.{op.name}")
    at = where()
    scalar_a, scalar_b = not _is_tile(a), not _is_tile(b)
    if scalar_a and scalar_b:
        return op.np(a, b)
    if scalar_a or scalar_b:
        tile, value = (ops.view_of(b, at), a) if scalar_a else (ops.view_of(a, at), b)
        out = Tensor(tile.shape, dtype or tile.dtype, SBUF, at=at)
        fn = ((lambda x: op.np(np.float32(value), x)) if scalar_a
              else (lambda x: op.np(x, np.float32(value))))
        ops.engine_op("vector", "TensorScalar", out.view(), (tile,), fn, at)
    else:
        va, vb = ops.view_of(a, at), ops.view_of(b, at)
        shape = ops.broadcast_shape(va.shape, vb.shape, f"nl.{op.name}", at)
        out = Tensor(shape, dtype or ops.result_dtype(va.dtype, vb.dtype), SBUF, at=at)
        ops.engine_op("vector", "TensorTensor", out.view(), (va, vb), op.np, at)
    ops.finish(trace)
    return out


def _unary(op: Op, x, dtype) -> Tensor:
    trace = current(f"nl.{op.name}")
    at = where()
    v = ops.view_of(x, at)
    out = Tensor(v.shape, dtype or v.dtype, SBUF, at=at)
    if op.engine == "scalar":
        ops.engine_op("scalar", "Activation", out.view(), (v,), op.np, at)
    else:
        ops.engine_op("vector", "TensorScalar", out.view(), (v,), op.np, at)
    ops.finish(trace)
    return out


def _is_tile(x) -> bool:
    return isinstance(x, (Tensor, View, ops.PendingMatmul))


add = Op("add", np.add, 2)
subtract = Op("subtract", np.subtract, 2)
multiply = Op("multiply", np.multiply, 2)
divide = Op("divide", np.divide, 2)
maximum = Op("maximum", np.maximum, 2)
minimum = Op("minimum", np.minimum, 2)
power = Op("power", np.power, 2)
equal = Op("equal", np.equal, 2)
not_equal = Op("not_equal", np.not_equal, 2)
greater = Op("greater", np.greater, 2)
greater_equal = Op("greater_equal", np.greater_equal, 2)
less = Op("less", np.less, 2)
less_equal = Op("less_equal", np.less_equal, 2)
logical_and = Op("logical_and", np.logical_and, 2)
logical_or = Op("logical_or", np.logical_or, 2)
bitwise_and = Op("bitwise_and", np.bitwise_and, 2)
bitwise_or = Op("bitwise_or", np.bitwise_or, 2)

exp = Op("exp", np.exp, 1, "scalar")
log = Op("log", np.log, 1, "scalar")
tanh = Op("tanh", np.tanh, 1, "scalar")
sigmoid = Op("sigmoid", lambda x: 1 / (1 + np.exp(-x)), 1, "scalar")
relu = Op("relu", lambda x: np.maximum(x, 0), 1, "scalar")
gelu = Op("gelu", _torch(torch.nn.functional.gelu), 1, "scalar")
gelu_apprx_tanh = Op("gelu_apprx_tanh", _gelu_tanh, 1, "scalar")
silu = Op("silu", lambda x: x / (1 + np.exp(-x)), 1, "scalar")
softplus = Op("softplus", lambda x: np.logaddexp(0, x), 1, "scalar")
rsqrt = Op("rsqrt", lambda x: 1 / np.sqrt(x), 1, "scalar")
sqrt = Op("sqrt", np.sqrt, 1, "scalar")
reciprocal = Op("reciprocal", lambda x: 1 / x, 1, "scalar")
square = Op("square", np.square, 1, "scalar")
erf = Op("erf", _torch(torch.erf), 1, "scalar")
sin = Op("sin", np.sin, 1, "scalar")
cos = Op("cos", np.cos, 1, "scalar")
sign = Op("sign", np.sign, 1, "scalar")
abs = Op("abs", np.abs, 1, "vector")
negative = Op("negative", np.negative, 1, "vector")
identity = Op("identity", lambda x: x, 1, "scalar")


def copy(x, dtype=None) -> Tensor:
    """A copy in SBUF (out of PSUM, or to cast: nl.copy(t, dtype=nl.bfloat16))."""
    trace = current("nl.copy")
    at = where()
    v = ops.view_of(x, at)
    out = Tensor(v.shape, dtype or v.dtype, SBUF, at=at)
    ops.engine_op("vector", "TensorCopy", out.view(), (v,), lambda a: a, at)
    ops.finish(trace)
    return out


# --- reductions ----------------------------------------------------------------------
def _reduce(name: str, fn, x, axis, dtype, keepdims: bool) -> Tensor:
    trace = current(f"nl.{name}")
    at = where()
    v = ops.view_of(x, at)
    axes = tuple(a % len(v.shape) for a in (axis if isinstance(axis, (tuple, list))
                                            else (axis,)))
    if 0 in axes:
        raise NkiError(f"nl.{name} reduces free dimensions only (axis {axis} includes the "
                       "partition dimension 0): transpose the tile first", at)
    shape = tuple(1 if i in axes else d for i, d in enumerate(v.shape) if keepdims
                  or i not in axes)
    out = Tensor(shape, dtype or v.dtype, SBUF, at=at)
    ops.engine_op("vector", "TensorReduce", out.view(), (v,),
                  lambda a: fn(a, axis=axes, keepdims=keepdims), at, free=v.free)
    ops.finish(trace)
    return out


def sum(x, axis, dtype=None, keepdims: bool = False, mask=None) -> Tensor:
    return _reduce("sum", np.sum, x, axis, dtype, keepdims)


def max(x, axis, dtype=None, keepdims: bool = False, mask=None) -> Tensor:
    return _reduce("max", np.max, x, axis, dtype, keepdims)


def min(x, axis, dtype=None, keepdims: bool = False, mask=None) -> Tensor:
    return _reduce("min", np.min, x, axis, dtype, keepdims)


def mean(x, axis, dtype=None, keepdims: bool = False, mask=None) -> Tensor:
    return _reduce("mean", np.mean, x, axis, dtype, keepdims)


def prod(x, axis, dtype=None, keepdims: bool = False, mask=None) -> Tensor:
    return _reduce("prod", np.prod, x, axis, dtype, keepdims)


# --- Tensor Engine -------------------------------------------------------------------
def matmul(x, y, transpose_x: bool = False, mask=None) -> ops.PendingMatmul:
    """x @ y into PSUM (fp32). transpose_x=True: x is given as [K, M] (stationary, the
    fast path); otherwise x is [M, K] and is transposed on the Tensor Engine first."""
    trace = current("nl.matmul")
    at = where()
    vx, vy = ops.view_of(x, at), ops.view_of(y, at)
    ops._te_dtype(vx, vy, at=at)
    if not transpose_x:
        vx = ops.transpose_to_sbuf(vx, vx.dtype, at).view()
    if vx.shape[0] != vy.shape[0]:
        raise NkiError(f"nl.matmul shape mismatch: contraction sizes {vx.shape[0]} and "
                       f"{vy.shape[0]} (x is {'[K, M]' if transpose_x else '[M, K]'})", at)
    ops.finish(trace)
    return ops.PendingMatmul(vx, vy, at)


def transpose(x, dtype=None, mask=None) -> Tensor:
    trace = current("nl.transpose")
    at = where()
    v = ops.view_of(x, at)
    out = ops.transpose_to_sbuf(v, dtypes.normalize(dtype) if dtype else v.dtype, at)
    ops.finish(trace)
    return out


# --- assignment (tile[...] = value, tile += value) -----------------------------------
def _assign(target, value) -> None:
    trace = current("an assignment")
    at = where()
    dst = ops.view_of(target, at)
    if isinstance(value, ops.PendingMatmul) and value.issued is None:
        ops.matmul(dst, value.stationary, value.moving, at, accumulate=False)
    elif _is_tile(value):
        src = ops.view_of(value, at)
        if src.tensor is dst.tensor and src.key == dst.key:
            return
        if HBM in (src.buffer, dst.buffer):
            ops.dma(dst, src, at)
        else:
            ops.engine_op("vector", "TensorCopy", dst, (src,), lambda a: a, at)
    else:
        ops.engine_op("vector", "Memset", dst, (), lambda: np.float32(value), at)
    ops.finish(trace)


def _accumulate(target, value):
    """`target += value`: a matmul accumulates in PSUM; anything else adds in place."""
    trace = current("+=")
    at = where()
    dst = ops.view_of(target, at)
    if isinstance(value, ops.PendingMatmul) and value.issued is None:
        if dst.buffer != PSUM:
            raise NkiError("a matmul accumulates into a PSUM tile: allocate the "
                           "accumulator with buffer=nl.psum", at)
        ops.matmul(dst, value.stationary, value.moving, at, accumulate=True)
    elif _is_tile(value):
        src = ops.view_of(value, at)
        ops.broadcast_shape(dst.shape, src.shape, "+=", at)
        ops.engine_op("vector", "TensorTensor", dst, (dst, src), np.add, at)
    else:
        ops.engine_op("vector", "TensorScalar", dst, (dst,),
                      lambda a: a + np.float32(value), at)
    ops.finish(trace)
    return target
