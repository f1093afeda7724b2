"""Slice arguments (Chrome `args`, Perfetto debug annotations), read by column or by slice.

Derived tables need a few keys of many slices (op_id, flops, ...); users sometimes
want one slice's whole dict. `DictArgs` holds the dicts a JSON trace already has;
`ColumnArgs` holds typed columns (slice, key, value) decoded from a .pftrace and
builds dicts only when asked.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
import orjson
import pandas as pd


def _run_bounds(sorted_values: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts, then the end: [0, ..., len] (empty: [])."""
    if not len(sorted_values):
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1], True])


_INT32 = np.iinfo(np.int32)


def compact(values: np.ndarray) -> np.ndarray:
    """Int64 ids, codes and row numbers as int32 where they fit: an engine-level trace's
    args hold tens of millions of rows, and their index columns were a third of what a
    loaded trace held (a 10 M-slice trace's 24 M rows: 1.3 GB of args, 0.9 GB of it ids,
    codes and the index by key)."""
    values = np.asarray(values)
    if values.dtype == np.int64 and len(values) and (
            _INT32.min <= values.min() and values.max() <= _INT32.max):
        return values.astype(np.int32)
    return values


def _merged_numbers(kind: np.ndarray, ival: np.ndarray, fval: np.ndarray | None
                    ) -> np.ndarray:
    """The int and float columns of args rows as one int64 column, the floats' bits in
    the float rows (into `ival` where it can be written: its callers let it go). Without
    `fval`, `ival` is that column already."""
    value = np.asarray(ival, np.int64)
    if fval is None or not (np.asarray(kind) == KIND_FLOAT).any():
        return value
    if not value.flags.writeable:
        value = value.copy()
    put_float_bits(value, fval, kind)
    return value


def put_float_bits(value: np.ndarray, fval: Any, kind: np.ndarray) -> None:
    """Write the float rows' values, as their bits, into the int64 `value` (in place)."""
    np.copyto(value, np.asarray(fval, np.float64).view(np.int64),
              where=np.asarray(kind) == KIND_FLOAT)


def _ids_like(ids: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """`ids` in `sorted_ids`' dtype for searching it: numpy would otherwise widen the
    whole sorted array on every search. Ids past int32 match none (clipped to its top,
    which no slice of a trace under 2**31 slices has)."""
    ids = np.asarray(ids)
    if sorted_ids.dtype == np.int32 and ids.dtype != np.int32:
        return np.clip(ids, -1, _INT32.max).astype(np.int32)
    return ids


class SliceArgs:
    """Access to the args of slices by slice id."""

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        """Values of `key` for the given slice ids (None where absent), as an object array."""
        raise NotImplementedError

    def numbers(self, key: str, ids: np.ndarray, default: float = 0,
                dtype: str = "int64") -> np.ndarray:
        """Values of `key` as numbers (`default` where absent or not a number)."""
        out = pd.to_numeric(pd.Series(self.column(key, ids), dtype=object), errors="coerce")
        values = out.fillna(default).to_numpy()
        if np.dtype(dtype).kind in "iu" and values.dtype.kind == "f":
            values = np.where(np.abs(values) < 2.0**63, values, default)  # past 64 bits: no count
        return values.astype(dtype)

    def texts(self, key: str, ids: np.ndarray) -> np.ndarray:
        """Values of `key` as strings ('' where absent), as an object array."""
        values = self.column(key, ids).tolist()
        return np.asarray(["" if v is None else str(v) for v in values], dtype=object)

    def text_column(self, key: str, ids: np.ndarray) -> Any:
        """`texts` as a pandas str column (what a table column of them becomes)."""
        return text_column(*self.text_codes(key, ids))

    def text_codes(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """`texts` as a code per slice into distinct strings: columns are built from them
        (`text_column`, `categorical`) without a string per row."""
        codes, values = pd.factorize(self.texts(key, ids))
        return codes.astype(np.int64), list(values)

    def dicts(self) -> list[dict[str, Any] | None]:
        """One dict (or None) per slice, indexed by slice id."""
        raise NotImplementedError

    def get(self, slice_id: int) -> dict[str, Any] | None:
        """The args of one slice."""
        raise NotImplementedError

    def dicts_of(self, ids: np.ndarray) -> list[dict[str, Any] | None]:
        """The dicts (or None) of the given slice ids only (-1: None), in their order."""
        return [self.get(i) if i >= 0 else None for i in np.asarray(ids).tolist()]

    def has_args(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of the given slice ids has args (-1: no)."""
        return np.asarray([d is not None for d in self.dicts_of(ids)], bool)

    def narrowed(self, keys: Collection[str], ids: np.ndarray) -> SliceArgs:
        """Args that answer for `keys` of the slices `ids` (of other keys or slices, they
        may answer nothing): what a derived table reads of many slices. A stored trace's
        read those rows in one pass; args in memory are themselves."""
        return self

    def in_parts(self, keys: Collection[str], ids: np.ndarray, rows: int
                 ) -> Iterator[tuple[SliceArgs, np.ndarray | None]]:
        """The args of `keys` of the slices `ids` in parts, each given with the slices it
        holds rows of (sorted ids), so that a table of millions of slices is built without
        holding all their args: args in memory are one part, given with None (it answers
        for every slice); a stored trace's, runs of about `rows` rows read once in file
        order. A slice's keys may lie in different parts; a key of a slice found in two is
        the first part's, as in the whole args."""
        yield self, None

    def holding(self, key: str, ids: np.ndarray) -> np.ndarray:
        """Which of the slices `ids` have `key`."""
        return np.not_equal(self.column(key, ids), None)  # type: ignore[call-overload]


def sorted_unique(ids: np.ndarray) -> np.ndarray:
    """The distinct ids in order, by a sort: numpy's unique hashes every value (seconds
    for millions of ids)."""
    ids = np.sort(np.asarray(ids))
    return ids[np.r_[True, ids[1:] != ids[:-1]]] if len(ids) else ids


class DictArgs(SliceArgs):
    """Args as a list of dicts, one per slice id."""

    def __init__(self, items: list[dict[str, Any] | None]) -> None:
        self._items = items

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        items = self._items
        out = np.empty(len(ids), object)
        out[:] = [(a.get(key) if a else None) for a in (items[i] for i in ids.tolist())]
        return out

    def dicts(self) -> list[dict[str, Any] | None]:
        return self._items

    def get(self, slice_id: int) -> dict[str, Any] | None:
        return self._items[slice_id]

    def dicts_of(self, ids: np.ndarray) -> list[dict[str, Any] | None]:
        items = self._items
        return [items[i] if i >= 0 else None for i in np.asarray(ids).tolist()]


KIND_INT, KIND_FLOAT, KIND_STR, KIND_BOOL, KIND_OTHER = 0, 1, 2, 3, 4
STR = pd.Series([], dtype="str").dtype  # pandas' default string dtype


def text_column(codes: np.ndarray, values: Any) -> Any:
    """The strings values[codes] (None where a code is -1) as a pandas str column, built in
    Arrow from the distinct values: no Python string per row."""
    import pyarrow as pa

    codes = np.asarray(codes, np.int64)
    dictionary = pa.array(values, pa.large_string())
    indices = pa.array(codes, mask=codes < 0) if (codes < 0).any() else pa.array(codes)
    strings = pa.DictionaryArray.from_arrays(indices, dictionary).cast(pa.large_string())
    return pd.array(strings, dtype=STR)


def categorical(codes: np.ndarray, values: Any) -> pd.Categorical:
    """values[codes] (missing where a code is -1 or its value None) as a pandas categorical
    whose categories are the distinct values used, in lexical order: a column built from the
    same strings has the same categories however the loader coded them (a fresh load and
    the trace cache's Parquet agree), and sorting it sorts by the text. No Python string
    is made per row: the codes are remapped through the distinct values, sorted in Arrow
    (UTF-8 bytes: the order of code points, as Python's)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = np.asarray(codes)  # in the dtype given: a copy per step of 16 M codes as
    # int64 was most of what building the instructions table held
    codes = codes if codes.dtype.kind == "i" else codes.astype(np.int64)
    strings = pa.array(values if isinstance(values, list) else list(values), pa.large_string())
    used = np.bincount(codes + 1, minlength=len(strings) + 1)[1:] > 0  # code -1: slot 0
    if strings.null_count:
        used &= np.asarray(strings.is_valid())
    candidates = np.flatnonzero(used)
    chosen = strings.take(candidates)
    order = np.asarray(pc.array_sort_indices(chosen), np.int64)
    ordered = chosen.take(order)
    first = np.ones(len(ordered), bool)  # the first of each run of equal strings
    if len(ordered) > 1:
        first[1:] = np.asarray(pc.not_equal(ordered[1:], ordered[:-1]))
    # the last slot: code -1 stays missing; codes in the categorical's own (small) dtype
    remap: np.ndarray = np.full(len(strings) + 1, -1, _code_dtype(int(first.sum())))
    remap[candidates[order]] = np.cumsum(first) - 1
    kept = pd.Index(pd.array(ordered.filter(pa.array(first)), dtype=STR))
    return pd.Categorical.from_codes(remap[codes],
                                     dtype=pd.CategoricalDtype(kept, ordered=False))


def _code_dtype(categories: int) -> type:
    """The smallest integer type that holds codes of so many categories and -1."""
    return next(t for t in (np.int8, np.int16, np.int32, np.int64)
                if categories <= np.iinfo(t).max)


def categorical_of(values: Any) -> pd.Categorical:
    """Strings (an array, a column; None or NaN: missing) as `categorical` makes them."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = pd.Categorical(values)
        return categorical(cat.codes, cat.categories.tolist())
    codes, uniques = pd.factorize(np.asarray(values, object))
    return categorical(codes, list(uniques))


def tidy_categoricals(frame: pd.DataFrame, all_used: bool = False) -> pd.DataFrame:
    """The frame with each categorical column's categories as `categorical` makes them
    (the distinct values used, in lexical order), so that equal columns have equal
    categories wherever they were made (a subset of the slices, a Parquet file read
    back: Parquet keeps its own order of a dictionary). Columns already so are kept.
    `all_used`: every category is known to be used (a file written from tidy columns,
    whose dictionary Parquet keeps or, re-encoding, builds from the values), only the
    order is checked."""
    for name in frame.columns:
        column = frame[name]
        if not isinstance(column.dtype, pd.CategoricalDtype):
            continue
        cat = column.array
        codes, kept = np.asarray(cat.codes), cat.categories
        if (kept.dtype == STR and kept.is_monotonic_increasing
                and (all_used or not len(kept)
                     or np.bincount(codes + 1, minlength=len(kept) + 1)[1:].all())):
            continue
        frame[name] = categorical(codes, kept.tolist())
    return frame


class ColumnArgs(SliceArgs):
    """Args as typed columns, one row per (slice, key): numbers (ints, bools, floats'
    bits) in one column, strings and nested values in another.

    `sval` holds each row's string (or nested value), None elsewhere; it may be given as
    (codes, distinct values), codes -1 where none: the Python object per row is then made
    only when asked (`sval`), and text columns are built from the codes. `ival` is taken
    over: the float rows' bits are written into it (`value`), unless it is read-only;
    `fval` None: `ival` holds them already.
    """

    def __init__(self, slice_id: np.ndarray, key: np.ndarray, names: list[str],
                 kind: np.ndarray, ival: np.ndarray, fval: np.ndarray | None,
                 sval: np.ndarray | tuple[np.ndarray, np.ndarray], n_slices: int) -> None:
        self.slice_id, self.key, self.names = compact(slice_id), compact(key), names
        self.kind = kind
        # one 8-byte number per row (a row holds one kind): ints and bools as they are, a
        # float's bits in float rows
        self.value = _merged_numbers(kind, ival, fval)
        self.scode: np.ndarray | None
        self.svalues: np.ndarray  # with scode: the distinct values its codes index
        if isinstance(sval, tuple):
            self.scode, self.svalues = compact(np.asarray(sval[0])), sval[1]
            self._sval: np.ndarray | None = None
        else:
            self.scode, self.svalues, self._sval = None, np.empty(0, object), sval
        self._n = n_slices
        self._rows: dict[int, tuple[np.ndarray, np.ndarray] | None] | None = None
        self._ids_sorted: bool | None = None
        self._by_slice: tuple[np.ndarray, np.ndarray] | None = None
        self._dicts: list[dict[str, Any] | None] | None = None

    @property
    def ival(self) -> np.ndarray:
        """Each row's int (bools as 0 and 1), 0 in the rows of other kinds."""
        return np.where(self.kind == KIND_FLOAT, 0, self.value)

    @property
    def fval(self) -> np.ndarray:
        """Each row's float, 0.0 in the rows of other kinds."""
        return np.where(self.kind == KIND_FLOAT, self.value.view(np.float64), 0.0)

    @property
    def sval(self) -> np.ndarray:
        """Each row's string or nested value (None where it has none), as objects."""
        if self._sval is None:
            assert self.scode is not None and self.svalues is not None
            values = np.empty(len(self.svalues) + 1, object)
            values[:-1] = self.svalues
            self._sval = values[self.scode]  # code -1: the None at the end
        return self._sval

    def _values(self, rows: np.ndarray) -> np.ndarray:
        """Python values of the given rows."""
        out = self.sval[rows].copy()
        kind = self.kind[rows]
        floats = self.value.view(np.float64)
        for code, column, cast in ((KIND_INT, self.value, None), (KIND_FLOAT, floats, None),
                                   (KIND_BOOL, self.value, bool)):
            m = kind == code
            if m.any():
                vals = column[rows[m]]
                out[m] = vals.astype(bool).tolist() if cast is bool else vals.tolist()
        return out

    def _key_rows(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Rows holding `key`, sorted by slice id, and those slice ids; each key's found
        when first asked for. (An index of every key at once, by sorting all rows by key,
        held what a report never asks for and peaked a cached 10 M-slice report.)"""
        try:
            code = self.names.index(key)
        except ValueError:
            return None
        if self._rows is None:
            self._rows = {}
        if code not in self._rows:
            rows = np.flatnonzero(self.key == code)
            if not self._by_slice_already():
                rows = rows[np.argsort(self.slice_id[rows], kind="stable")]
            rows = compact(rows)
            self._rows[code] = (rows, self.slice_id[rows]) if len(rows) else None
        return self._rows[code]

    def _by_slice_already(self) -> bool:
        """Whether the rows come in slice-id order (as decoders and the store write them)."""
        if self._ids_sorted is None:
            ids = self.slice_id
            self._ids_sorted = bool((ids[1:] >= ids[:-1]).all())
        return self._ids_sorted

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        out = np.empty(len(ids), object)
        hits = self._hits(key, ids)
        if hits is not None:
            hit, rows = hits
            out[hit] = self._values(rows)
        return out

    def holding(self, key: str, ids: np.ndarray) -> np.ndarray:
        hits = self._hits(key, ids)
        return hits[0] if hits is not None else np.zeros(len(ids), bool)

    def _hits(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """For the given ids: which hold `key`, and the arg rows of those that do."""
        found = self._key_rows(key)
        if found is None or not len(ids):
            return None
        rows, sids = found
        ids = _ids_like(ids, sids)
        pos = np.searchsorted(sids, ids)
        pos_c = np.minimum(pos, len(sids) - 1)
        hit = (pos < len(sids)) & (sids[pos_c] == ids)
        return hit, rows[pos_c[hit]]

    def numbers(self, key: str, ids: np.ndarray, default: float = 0,
                dtype: str = "int64") -> np.ndarray:
        # numeric columns straight from the typed arrays, without Python objects
        found = self._key_rows(key)
        if found is not None and not np.isin(self.kind[found[0]], (KIND_INT, KIND_FLOAT)).all():
            return super().numbers(key, ids, default, dtype)
        hits = self._hits(key, ids)
        if hits is None:
            return np.full(len(ids), default).astype(dtype)
        hit, rows = hits
        kind = self.kind[rows]
        if (kind == KIND_INT).all():
            out = np.full(len(ids), default, np.result_type(np.int64, np.asarray(default)))
            out[hit] = self.value[rows]
        else:
            out = np.full(len(ids), default, np.float64)
            values = self.value[rows]
            out[hit] = np.where(kind == KIND_INT, values, values.view(np.float64))
            if np.dtype(dtype).kind in "iu":  # past 64 bits: no count
                out = np.where(np.abs(out) < 2.0**63, out, default)
        return out.astype(dtype, copy=False)

    def texts(self, key: str, ids: np.ndarray) -> np.ndarray:
        found = self._key_rows(key)
        if found is not None and not (self.kind[found[0]] == KIND_STR).all():
            return super().texts(key, ids)
        out = np.full(len(ids), "", object)
        hits = self._hits(key, ids)
        if hits is not None:
            hit, rows = hits
            values = self.sval[rows]
            # a string that could not be resolved (numpy's stubs take no None here)
            values[np.equal(values, None)] = ""  # type: ignore[call-overload]
            out[hit] = values
        return out

    def text_codes(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
        found = self._key_rows(key)
        if self.scode is None or (found is not None
                                  and not (self.kind[found[0]] == KIND_STR).all()):
            return super().text_codes(key, ids)
        codes = np.full(len(ids), -1, np.int64)
        hits = self._hits(key, ids)
        if hits is not None:
            hit, rows = hits
            codes[hit] = self.scode[rows]
        # the distinct strings these rows use, '' for absent or unresolved ones
        codes, used = pd.factorize(codes)  # hashing: no sort of every row
        values = [self.svalues[c] if c >= 0 else None for c in used.tolist()]
        return codes.astype(np.int64), ["" if v is None else v for v in values]

    def dicts(self) -> list[dict[str, Any] | None]:
        if self._dicts is None:
            items: list[dict[str, Any] | None] = [None] * self._n
            order = np.argsort(self.slice_id, kind="stable")
            ids = self.slice_id[order]
            keys = np.asarray(self.names, object)[self.key[order]].tolist()
            values = self._values(order).tolist()
            bounds = _run_bounds(ids).tolist()
            ids_list = ids.tolist()
            for a, b in itertools.pairwise(bounds):
                items[ids_list[a]] = dict(zip(keys[a:b], values[a:b], strict=True))
            self._dicts = items
        return self._dicts

    def get(self, slice_id: int) -> dict[str, Any] | None:
        return self.dicts_of(np.array([slice_id]))[0]

    def _slice_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows in slice-id order (file order within a slice), and their slice ids."""
        if self._by_slice is None:
            order = compact(np.argsort(self.slice_id, kind="stable"))
            self._by_slice = (order, self.slice_id[order])
        return self._by_slice

    def dicts_of(self, ids: np.ndarray) -> list[dict[str, Any] | None]:
        ids = np.asarray(ids, np.int64)
        if self._dicts is not None:
            items = self._dicts
            return [items[i] if i >= 0 else None for i in ids.tolist()]
        order, sids = self._slice_rows()
        wanted = _ids_like(ids, sids)
        lo, hi = np.searchsorted(sids, wanted, "left"), np.searchsorted(sids, wanted, "right")
        counts = hi - lo
        # each id's rows, one after another: lo of its run plus 0, 1, ... within it
        starts = np.repeat(lo - np.r_[0, np.cumsum(counts)[:-1]], counts)
        rows = order[starts + np.arange(int(counts.sum()))]
        keys = np.asarray(self.names, object)[self.key[rows]].tolist()
        values = self._values(rows).tolist()
        out: list[dict[str, Any] | None] = []
        at = 0
        for n in counts.tolist():
            out.append(dict(zip(keys[at:at + n], values[at:at + n], strict=True)) if n
                       else None)
            at += n
        return out

    def has_args(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        has = np.zeros(self._n + 1, bool)  # the last: what -1 reads
        has[self.slice_id] = True
        return has[ids]


class LazyArgs(SliceArgs):
    """Args decoded on first use (a large .pftrace loads its tables first)."""

    def __init__(self, build: Callable[[], SliceArgs]) -> None:
        self._build: Callable[[], SliceArgs] | None = build
        self._args: SliceArgs | None = None

    @property
    def decoded(self) -> SliceArgs | None:
        """The args if they are decoded already, else None."""
        return self._args

    def resolved(self) -> SliceArgs:
        """The args, decoded now if they are not yet."""
        return self._get()

    def _get(self) -> SliceArgs:
        if self._args is None:
            assert self._build is not None
            self._args = self._build()
            self._build = None  # let go of the raw bytes it held
        return self._args

    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        return self._get().column(key, ids)

    def numbers(self, key: str, ids: np.ndarray, default: float = 0,
                dtype: str = "int64") -> np.ndarray:
        return self._get().numbers(key, ids, default, dtype)

    def texts(self, key: str, ids: np.ndarray) -> np.ndarray:
        return self._get().texts(key, ids)

    def text_column(self, key: str, ids: np.ndarray) -> Any:
        return self._get().text_column(key, ids)

    def text_codes(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
        return self._get().text_codes(key, ids)

    def dicts(self) -> list[dict[str, Any] | None]:
        return self._get().dicts()

    def get(self, slice_id: int) -> dict[str, Any] | None:
        return self._get().get(slice_id)

    def dicts_of(self, ids: np.ndarray) -> list[dict[str, Any] | None]:
        return self._get().dicts_of(ids)

    def has_args(self, ids: np.ndarray) -> np.ndarray:
        return self._get().has_args(ids)

    def holding(self, key: str, ids: np.ndarray) -> np.ndarray:
        return self._get().holding(key, ids)


INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


class ArgsBuilder:
    """JSON args dicts turned into `ColumnArgs` rows as they come, a chunk of slices at a
    time: a large trace never holds a dict per slice. Keys and strings become codes;
    nested values (lists, objects) and numbers past 64 bits stay objects, each distinct
    one once; null is an `other` row without a value."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.values: dict[Any, int] = {}  # strings, and nested values by their JSON text
        self.distinct: list[Any] = []
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, first_id: int, items: list[dict[str, Any] | None]) -> None:
        """The args of slices `first_id`, `first_id + 1`, ... (None: no args)."""
        rows: list[tuple[int, int, int, int, float, int]] = []
        keys, code_of = self.keys, self._code
        for i, d in enumerate(items, first_id):
            if not d:
                continue
            for k, v in d.items():
                key = keys.get(k)
                if key is None:
                    key = keys[k] = len(keys)
                if v is True or v is False:
                    rows.append((i, key, KIND_BOOL, int(v), 0.0, -1))
                elif v.__class__ is int and INT64_RANGE[0] <= v <= INT64_RANGE[1]:
                    rows.append((i, key, KIND_INT, v, 0.0, -1))
                elif isinstance(v, float):
                    rows.append((i, key, KIND_FLOAT, 0, float(v), -1))
                elif v.__class__ is str:
                    rows.append((i, key, KIND_STR, 0, 0.0, code_of(v)))
                elif v is None:
                    rows.append((i, key, KIND_OTHER, 0, 0.0, -1))
                else:  # nested values, numbers past 64 bits
                    rows.append((i, key, KIND_OTHER, 0, 0.0, code_of(v)))
        if not rows:
            return
        # one structured array straight from the tuples, then a column per field: half the
        # time of transposing the rows in Python and converting each column
        table = np.fromiter(rows, ROW_RECORD, len(rows))
        self.parts.append(tuple(np.ascontiguousarray(table[name]) for name in ROW_FIELDS))

    def _code(self, value: Any) -> int:
        """The code of a string or nested value (each distinct one kept once)."""
        if value.__class__ is str:
            found = self.values.get(value)
            if found is None:
                found = self.values[value] = len(self.distinct)
                self.distinct.append(value)
            return found
        text = _nested_key(value)
        found = self.values.get(text)
        if found is None:
            found = self.values[text] = len(self.distinct)
            self.distinct.append(value)
        return found

    def key_code(self, name: str) -> int:
        """The code of a key, new keys numbered on."""
        return self.keys.setdefault(name, len(self.keys))

    def build(self, n_slices: int, new_id: np.ndarray | None = None,
              derive: Callable[[ArgsBuilder, list[tuple[np.ndarray, ...]]],
                               list[tuple[np.ndarray, ...]]] | None = None) -> ColumnArgs:
        """The args, slice ids mapped through `new_id` (old id -> new id) if given, and
        `derive`d (rows added or dropped, on the new ids). Each part is copied into the
        result and let go in turn: the args are never held twice."""
        parts, self.parts = self.parts, []
        if new_id is not None:
            ids = np.asarray(new_id, np.int64)
            parts = [(ids[part[0]], *part[1:]) for part in parts]
        if derive is not None:
            parts = derive(self, parts)
        n = sum(len(part[0]) for part in parts)
        columns = [np.empty(n, dtype) for dtype in ROW_TYPES]
        at = 0
        while parts:
            part = parts.pop(0)
            for column, values in zip(columns, part, strict=True):
                column[at:at + len(values)] = values
            at += len(part[0])
        sid, key, kind, ival, fval, scode = columns
        distinct = np.empty(len(self.distinct), object)
        distinct[:] = self.distinct
        return ColumnArgs(sid, key, list(self.keys), kind, ival, fval, (scode, distinct),
                          n_slices)


# an args row's columns: slice id, key code, kind, int value, float value, value code
ROW_TYPES = (np.int64, np.int32, np.int8, np.int64, np.float64, np.int64)
ROW_FIELDS = ("slice_id", "key", "kind", "ival", "fval", "scode")
ROW_RECORD = np.dtype(list(zip(ROW_FIELDS, ROW_TYPES, strict=True)))


def _nested_key(value: Any) -> bytes | tuple[str, str]:
    """What tells a nested value from another: its JSON text, keys sorted. orjson writes
    it many times faster than the standard library; the standard library's text is taken
    where orjson's could be ambiguous (it writes NaN as null) or orjson cannot write the
    value (numbers past 64 bits, floats that keep their digits)."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        pass
    else:
        if b"null" not in text:
            return text  # bytes: never equal to a string's key, nor to the tuples below
    return ("\0json", json.dumps(value, sort_keys=True, default=str))
