"""The `args` column of `trace.slices`: each slice's args as a dict, made only for the rows
read.

A dict per slice is what users expect to find in that column, but building one for every
slice of a large trace costs seconds and several times the slices' own memory (1 M slices:
2.4 M args, 240 MiB of dicts). `ArgsArray` is a pandas extension array holding each row's
slice id and the trace's columnar args (`loaders.args.SliceArgs`): selecting, sorting,
joining or concatenating rows moves ids only, and a row's dict is built when it is read
(`sl["args"].iloc[i]`, iterating, `.apply`, `.tolist()`, printing), for those rows alone;
`sl["args"].args.get(key)` reads one key of every row without a dict.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.loaders.args import DictArgs, SliceArgs
from pandas.api.extensions import ExtensionArray, ExtensionDtype, take

_CHUNK = 1 << 16  # rows whose dicts an iteration builds at a time


class ArgsDtype(ExtensionDtype):
    """Slice args: a dict (or None) per row."""

    name = "slice_args"
    type = dict
    kind = "O"
    na_value = None

    @classmethod
    def construct_array_type(cls) -> builtins.type[ArgsArray]:  # `type` is dict here
        return ArgsArray


class ArgsArray(ExtensionArray):
    """Slice ids (-1: none) over a trace's args; dicts made on reading."""

    def __init__(self, source: SliceArgs, ids: np.ndarray) -> None:
        self._source = source
        self._ids = np.asarray(ids, np.int64)

    # --- construction ----------------------------------------------------------------
    @classmethod
    def _from_sequence(cls, scalars: Sequence[Any] | np.ndarray, *, dtype: Any = None,
                       copy: bool = False) -> ArgsArray:
        if isinstance(scalars, ArgsArray):
            return scalars.copy() if copy else scalars
        items = list(scalars)
        for at, value in enumerate(items):
            if not isinstance(value, dict):
                if value is not None and not (pd.api.types.is_scalar(value)
                                              and pd.isna(value)):
                    # not args (a function's results over them): pandas keeps them as
                    # objects
                    raise TypeError(f"slice args are dicts, not {type(value).__name__}")
                items[at] = None
        return cls(DictArgs(items), np.arange(len(items)))

    @classmethod
    def _from_factorized(cls, values: np.ndarray, original: ArgsArray) -> ArgsArray:
        return cls._from_sequence(values)

    @classmethod
    def _concat_same_type(cls, to_concat: Sequence[ArgsArray]) -> ArgsArray:
        sources = {id(a._source) for a in to_concat}
        if len(sources) == 1:  # rows of one trace: their ids
            return cls(to_concat[0]._source, np.concatenate([a._ids for a in to_concat]))
        return cls._from_sequence([d for a in to_concat for d in a._dicts()])

    # --- what pandas asks of an array --------------------------------------------------
    @property
    def dtype(self) -> ArgsDtype:
        return ArgsDtype()

    @property
    def nbytes(self) -> int:
        return int(self._ids.nbytes)

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, (int, np.integer)):
            slice_id = int(self._ids[item])
            return self._source.get(slice_id) if slice_id >= 0 else None
        item = pd.api.indexers.check_array_indexer(self, item)
        return type(self)(self._source, self._ids[item])

    def __setitem__(self, key: Any, value: Any) -> None:
        """A write makes these rows' dicts, then changes them: this array only, never
        the trace's args."""
        items = self._dicts()
        self._source, self._ids = DictArgs(items), np.arange(len(items))
        positions = np.arange(len(items))[key]
        if np.ndim(positions) == 0:
            items[int(positions)] = value
            return
        values = value if isinstance(value, (list, tuple, np.ndarray, ArgsArray)) \
            else [value] * len(positions)
        for at, v in zip(np.asarray(positions).tolist(), list(values), strict=True):
            items[at] = v

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        for lo in range(0, len(self._ids), _CHUNK):
            yield from self._source.dicts_of(self._ids[lo:lo + _CHUNK])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(len(self._ids), object)
        out[:] = self._dicts()
        return out if dtype is None or np.dtype(dtype) == object else out.astype(dtype)

    def __eq__(self, other: object) -> np.ndarray:  # type: ignore[override]
        mine = self._dicts()
        if isinstance(other, (ArgsArray, list, np.ndarray, pd.Series)):
            return np.array([a == b for a, b in zip(mine, list(other), strict=True)], bool)
        return np.array([a == other for a in mine], bool)

    def isna(self) -> np.ndarray:
        return ~self._source.has_args(self._ids)

    def take(self, indices: Any, *, allow_fill: bool = False,
             fill_value: Any = None) -> ArgsArray:
        if allow_fill and fill_value is not None and not pd.isna(fill_value):
            raise ValueError("the args column fills missing rows with None only")
        ids = take(self._ids, indices, allow_fill=allow_fill, fill_value=-1)
        return type(self)(self._source, ids)

    def copy(self) -> ArgsArray:
        return type(self)(self._source, self._ids.copy())

    def __reduce__(self) -> Any:
        # pickled (to another process) as the dicts of these rows alone
        return (type(self)._from_sequence, (self._dicts(),))

    def _dicts(self) -> list[dict[str, Any] | None]:
        return self._source.dicts_of(self._ids)

    def _formatter(self, boxed: bool = False) -> Any:
        return repr


@pd.api.extensions.register_series_accessor("args")
class ArgsAccessor:
    """`sl["args"].args.get(key)`: one key of every row's args as a column, read from the
    trace's columnar args (no dict made); None where a row's args lack it."""

    def __init__(self, series: pd.Series) -> None:
        if not isinstance(series.array, ArgsArray):
            # AttributeError, as pandas accessors raise: hasattr(series, "args") is False
            raise AttributeError(".args is for the args column of trace.slices")  # noqa: TRY004
        self._series = series

    def get(self, key: str) -> pd.Series:
        array = self._series.array
        assert isinstance(array, ArgsArray)
        ids = array._ids
        values = np.full(len(ids), None, object)
        present = ids >= 0
        values[present] = array._source.column(key, ids[present])
        return pd.Series(values, index=self._series.index, name=key)


def args_column(source: SliceArgs, n_slices: int) -> pd.Series:
    """The args of slices 0 .. n_slices - 1 (a slices frame's rows), as a column."""
    return pd.Series(ArgsArray(source, np.arange(n_slices)), name="args")
