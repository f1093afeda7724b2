"""Tensors (HBM, SBUF, PSUM), views of them, and the dependencies between accesses.

Every access to a region of a tensor is recorded with the instructions that made it:
a read waits for the writes it overlaps (read after write), a write for the reads
and writes it overlaps (write after read, write after write). Regions are boxes, one
[start, stop) per dimension, so tiles of one tensor written by different
instructions stay independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from neuron_explorer.nki import dtypes
from neuron_explorer.nki.errors import NkiError
from neuron_explorer.nki.trace import current_trace, where

Box = tuple[tuple[int, int], ...]
HBM, SBUF, PSUM = "hbm", "sbuf", "psum"


class par_dim:
    """Marks the partition dimension of a shape: nl.ndarray((4, nl.par_dim(128), 512))."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __index__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"par_dim({self.size})"


def _overlap(a: Box, b: Box) -> bool:
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True))


def _contains(outer: Box, inner: Box) -> bool:
    return all(lo1 <= lo2 and hi2 <= hi1
               for (lo1, hi1), (lo2, hi2) in zip(outer, inner, strict=True))


class Operand:
    """Arithmetic on tiles: `a + b`, `a * 2.0`, `-a`, `acc += t` (the language's ops)."""

    def _lang(self):
        from neuron_explorer.nki import language
        return language

    def __add__(self, o):
        return self._lang().add(self, o)

    def __radd__(self, o):
        return self._lang().add(o, self)

    def __sub__(self, o):
        return self._lang().subtract(self, o)

    def __rsub__(self, o):
        return self._lang().subtract(o, self)

    def __mul__(self, o):
        return self._lang().multiply(self, o)

    def __rmul__(self, o):
        return self._lang().multiply(o, self)

    def __truediv__(self, o):
        return self._lang().divide(self, o)

    def __rtruediv__(self, o):
        return self._lang().divide(o, self)

    def __neg__(self):
        return self._lang().negative(self)

    def __iadd__(self, o):
        return self._lang()._accumulate(self, o)

    def __isub__(self, o):
        self._lang()._assign(self, self._lang().subtract(self, o))
        return self

    def __imul__(self, o):
        self._lang()._assign(self, self._lang().multiply(self, o))
        return self


class Tensor(Operand):
    """A tensor in HBM, SBUF or PSUM. On-chip tensors have the partition dimension
    first (or marked with nl.par_dim) and at most 128 partitions."""

    def __init__(self, shape: Sequence, dtype: object, buffer: str, name: str | None = None,
                 data: np.ndarray | None = None, initialized: bool = False,
                 at: str | None = None) -> None:
        self.at = at or where()
        self.dtype = dtypes.normalize(dtype)
        self.buffer = buffer
        self.name = name
        dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        marked = [i for i, d in enumerate(dims) if isinstance(d, par_dim)]
        self.partition_axis = marked[0] if marked else 0
        self.shape = tuple(int(d) for d in dims)
        if not self.shape or any(d <= 0 for d in self.shape):
            raise NkiError(f"{self.describe()}: every dimension must be positive", self.at)
        self.writes: list = []  # (box, ids)
        self.reads: list = []
        self.accesses = self.writes  # what a reuse of this tile's memory waits for
        trace = current_trace.get()
        self.numerics = trace.numerics if trace is not None else True
        self.data: np.ndarray | None  # None when the kernel runs without numerics
        if data is not None:
            self.data = data
        elif self.numerics:
            self.data = np.zeros(self.shape, dtypes.host_dtype(self.dtype))
        else:
            self.data = None
        self.written = None if initialized else np.zeros(self.shape, bool)
        self.builder = None  # SBUF: the builder allocating it, and its tile there
        self.tile: int | None = None
        if buffer != HBM:
            self._place_on_chip(trace)

    def _place_on_chip(self, trace) -> None:
        p = self.shape[self.partition_axis]
        pmax = trace.preset.partitions if trace else 128
        if p > pmax:
            raise NkiError(f"{self.describe()}: partition dimension {p} exceeds "
                           f"nl.tile_size.pmax ({pmax}); split it into tiles of at most "
                           f"{pmax} partitions", self.at)
        if trace is None:
            raise NkiError("on-chip tensors can only be created inside a running kernel",
                           self.at)
        per_partition = math.prod(self.shape) // p * dtypes.ITEMSIZE[self.dtype]
        self.accesses = []  # writes and reads: shared with the allocator's free list
        deps, self.tile = trace.track(self, self.buffer, per_partition, self.describe(),
                                      self.at, self.accesses, p)
        if self.tile is not None:
            self.builder = trace.builder
        if deps:  # memory reused: the first write waits for the previous tenant
            self.reads.append((self.full_box(), tuple(deps)))

    def describe(self) -> str:
        label = f"{self.name!r} " if self.name else ""
        return (f"{label}{self.buffer.upper()} tensor {list(self.shape)} {self.dtype} "
                f"(created at {self.at})")

    def __repr__(self) -> str:
        return f"<nki {self.describe()}>"

    def full_box(self) -> Box:
        return tuple((0, d) for d in self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return dtypes.ITEMSIZE[self.dtype]

    def view(self) -> View:
        return View(self, tuple(slice(0, d) for d in self.shape), self.full_box(), self.shape,
                    self.partition_axis, None)

    def __getitem__(self, key) -> View:
        return index(self, key)

    def __setitem__(self, key, value) -> None:
        self._lang()._assign(index(self, key), value)

    # --- dependencies ----------------------------------------------------------------
    def read_deps(self, box: Box) -> list[int]:
        return [i for b, ids in self.writes if _overlap(b, box) for i in ids]

    def write_deps(self, box: Box) -> list[int]:
        return [i for lst in (self.writes, self.reads) for b, ids in lst
                if _overlap(b, box) for i in ids]

    def record(self, box: Box, ids: Sequence[int], write: bool) -> None:
        ids = tuple(ids)
        if not ids:
            return
        if self.builder is not None:
            self.builder.touch(self.tile, ids, write, whole=box == self.full_box())
        if write:  # accesses this write covers are ordered before it: forget them
            self.writes[:] = [a for a in self.writes if not _contains(box, a[0])]
            self.reads[:] = [a for a in self.reads if not _contains(box, a[0])]
            self.writes.append((box, ids))
        else:
            self.reads.append((box, ids))
        if self.buffer != HBM:
            self.accesses[:] = self.writes + self.reads


class View(Operand):
    """A region of a tensor: `t[0:128, 512 * n:512 * (n + 1)]`, `t[i_p, i_f]`."""

    def __init__(self, tensor: Tensor, key: tuple, box: Box, shape: tuple[int, ...],
                 partition_pos: int | None, out_of_bounds: np.ndarray | None) -> None:
        self.tensor = tensor
        self.key = key
        self.box = box
        self.shape = shape
        self.partition_pos = partition_pos  # None: the partition dim was indexed away
        self.out_of_bounds = out_of_bounds

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    @property
    def buffer(self) -> str:
        return self.tensor.buffer

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def free(self) -> int:
        """Elements per partition."""
        return max(1, math.prod(self.shape[1:]))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.tensor.itemsize

    def __repr__(self) -> str:
        return f"<nki view {list(self.shape)} of {self.tensor.describe()}>"

    def __getitem__(self, key) -> View:
        if any(isinstance(k, np.ndarray) for k in self.key):
            raise NkiError("indexing an indexed view is not supported: index the tensor "
                           "once", where())
        return index(self.tensor, _compose(self.key, key, self.tensor.shape))

    def __setitem__(self, key, value) -> None:
        self[key]._lang()._assign(self[key], value)

    def check_bounds(self, mask: np.ndarray | None, at: str) -> None:
        oob = self.out_of_bounds
        if oob is not None and (oob if mask is None else oob & mask).any():
            raise NkiError(f"index out of bounds of {self.tensor.describe()} "
                           "(mask the access or fix the index)", at)

    def values(self, at: str, mask: np.ndarray | None = None) -> np.ndarray | None:
        """The data read (None when the kernel runs without numerics); checks the
        region was written."""
        t = self.tensor
        if t.written is not None:
            covered = t.written[self.key]
            if not (covered if mask is None else covered | ~mask).all():
                raise NkiError(f"{t.describe()} is read before it is written (region "
                               f"{_box_text(self.box)}); write it first (nl.load, "
                               "nisa.memset, nl.zeros...)", at)
        if t.data is None:
            return None
        out = t.data[self.key]
        if mask is not None:
            out = np.where(mask, out, 0)
        return np.array(out, copy=True)

    def store(self, values: np.ndarray | None, mask: np.ndarray | None = None) -> None:
        """Write `values` (float32 or the dtype; broadcast to the view) into the region."""
        t = self.tensor
        key = self.key
        if mask is not None:  # write only the selected elements (clipped indices repeat)
            mask = np.broadcast_to(mask, self.shape)
            if not any(isinstance(k, np.ndarray) for k in key):
                grids = np.broadcast_arrays(*np.ix_(*[np.arange(s.start, s.stop) if isinstance(
                    s, slice) else np.atleast_1d(s) for s in key]))
                full = [a.reshape(self.shape) for a in grids]
            else:
                full = list(np.broadcast_arrays(*[np.asarray(k) for k in key]))
            key = tuple(a[mask] for a in full)
        if t.written is not None:
            t.written[key] = True
        if t.data is None or values is None:
            return
        new = dtypes.cast(np.broadcast_to(values, self.shape), t.dtype)
        t.data[key] = new if mask is None else new[mask]

    def read_deps(self) -> list[int]:
        return self.tensor.read_deps(self.box)

    def write_deps(self) -> list[int]:
        return self.tensor.write_deps(self.box)

    def record(self, ids: Sequence[int], write: bool) -> None:
        self.tensor.record(self.box, ids, write)

    def contiguous_bytes(self) -> int:
        """The longest contiguous run of the region in row-major memory."""
        run = self.tensor.itemsize
        for (lo, hi), dim in zip(reversed(self.box), reversed(self.tensor.shape), strict=True):
            run *= hi - lo
            if hi - lo != dim:
                break
        return run


def _box_text(box: Box) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def _compose(outer: tuple, key, shape: tuple[int, ...]) -> tuple:
    """A basic key applied to a view given by basic key `outer`, as one key."""
    key = key if isinstance(key, tuple) else (key,)
    remaining = [i for i, k in enumerate(outer) if not isinstance(k, (int, np.integer))]
    if len(key) > len(remaining):
        raise NkiError("too many indices for the view", where())
    out = list(outer)
    for dim, k in zip(remaining, key, strict=False):
        base = outer[dim]
        if isinstance(k, (int, np.integer)):
            size = base.stop - base.start
            if not -size <= k < size:
                raise NkiError(f"index {k} out of range for a dimension of size {size}",
                               where())
            out[dim] = base.start + int(k) % size
        elif isinstance(k, slice):
            start, stop, step = k.indices(base.stop - base.start)
            out[dim] = slice(base.start + start, base.start + stop, step)
        else:
            raise NkiError("a view can only be sliced further with ints and slices",
                           where())
    return tuple(out)


def index(tensor: Tensor, key) -> View:
    """Resolve an NKI index (ints, slices, nl.arange / nl.mgrid expressions)."""
    at = where()
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (tensor.ndim - len(key) + 1) + key[i + 1:]
    if len(key) > tensor.ndim:
        raise NkiError(f"{len(key)} indices for {tensor.describe()}", at)
    key = key + (slice(None),) * (tensor.ndim - len(key))
    fancy = any(isinstance(k, np.ndarray) and k.ndim > 0 for k in key)
    if fancy and any(isinstance(k, slice) for k in key):
        raise NkiError("mixing index arrays (nl.arange, nl.mgrid) with slices is not "
                       "supported: index every dimension with nl.arange/nl.mgrid", at)
    out_key: list[np.ndarray | slice | int] = []
    box, shape, oob_parts = [], [], []
    partition_pos, pos = None, 0
    for dim, (k, size) in enumerate(zip(key, tensor.shape, strict=True)):
        if isinstance(k, np.ndarray) and k.ndim > 0:
            arr = k.astype(np.int64)
            bad = (arr < 0) | (arr >= size)
            if bad.any():
                oob_parts.append(bad)
                arr = np.clip(arr, 0, size - 1)
            out_key.append(arr)
            box.append((int(arr.min()), int(arr.max()) + 1))
            if dim == tensor.partition_axis:
                partition_pos = 0
        elif isinstance(k, slice):
            start, stop, step = k.indices(size)
            if stop <= start:
                raise NkiError(f"empty slice {start}:{stop} of dimension {dim} of "
                               f"{tensor.describe()}", at)
            if step != 1:
                raise NkiError("strided slices are not supported: use nl.arange with a "
                               "stride", at)
            out_key.append(slice(start, stop))
            box.append((start, stop))
            shape.append(stop - start)
            if dim == tensor.partition_axis:
                partition_pos = pos
            pos += 1
        else:
            try:
                i = int(k)
            except TypeError:
                raise NkiError(f"unsupported index {k!r}", at) from None
            if not -size <= i < size:
                raise NkiError(f"index {i} out of range for dimension {dim} (size {size}) "
                               f"of {tensor.describe()}", at)
            i %= size
            out_key.append(i)
            box.append((i, i + 1))
    if fancy:
        arrays = [k for k in out_key if isinstance(k, np.ndarray)]
        shape = list(np.broadcast_shapes(*(a.shape for a in arrays)))
        oob = None
        for part in oob_parts:
            part = np.broadcast_to(part, shape)
            oob = part if oob is None else oob | part
        return View(tensor, tuple(out_key), tuple(box), tuple(shape), partition_pos, oob)
    return View(tensor, tuple(out_key), tuple(box), tuple(shape), partition_pos, None)


def operand(x, at: str) -> View:
    """A tensor or view as a view; anything else is an error naming the line."""
    if isinstance(x, Tensor):
        return x.view()
    if isinstance(x, View):
        return x
    raise NkiError(f"expected an NKI tensor or tile, got {type(x).__name__}", at)

