"""A stored trace's args, read from its Parquet file a key (or a few slices) at a time.

An analysis asks for one key of many slices (`op_id` of the ops, `bytes` of the
instructions); decoding the whole args table for it held an engine-level trace's every
arg in memory (a cached 10 M-slice report: 24 M rows, about 0.7 GB with their index by
key) to answer questions whose answers were a few columns, or nothing at all. Here the
file's `key` column is read once (a byte or two per row), and a key's rows are read from
the row groups that hold it; the slices a dict is asked for are read from the row groups
whose slice-id range holds them. The whole table is decoded only for `dicts()` and for
the long table (`trace.table("args")`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
from neuron_explorer.loaders.args import ColumnArgs, LazyArgs, SliceArgs, sorted_unique


class StoredArgsUnreadable(Exception):
    """The args file cannot be read (damaged, of another build): the whole args come from
    the fallback instead."""


class StoredArgs(LazyArgs):
    """Args over a store's `args.parquet`. `read_groups(groups, columns)` reads row groups
    of it as an Arrow table (None when unreadable); `row_groups()` gives each group's row
    count and slice-id range; `whole()` decodes every row (the store's file, or the trace
    parsed again)."""

    def __init__(self, read_groups: Callable[[list[int], list[str] | None], Any],
                 row_groups: Callable[[], list[tuple[int, int, int]] | None],
                 whole: Callable[[], SliceArgs], n_slices: int) -> None:
        super().__init__(whole)
        self._read_groups, self._row_groups, self._n = read_groups, row_groups, n_slices
        self._keys: tuple[np.ndarray, list[str], np.ndarray] | None = None
        # the keys read last, up to KEPT_KEY_BYTES: an analysis asks for the same key of
        # several sets of slices, but holding every key a first load's derived tables read
        # kept 0.6 GB of a 10 M-slice trace's args for nothing after
        self._by_key: OrderedDict[str, ColumnArgs] = OrderedDict()
        self._groups_read = 0  # row groups the key reads have decoded
        self._group_list: list[tuple[int, int, int]] | None = None
        self._lock = threading.Lock()  # the dashboard's callbacks share a trace

    # --- a key of many slices ---------------------------------------------------------
    def column(self, key: str, ids: np.ndarray) -> np.ndarray:
        return self._answering(key, ids).column(key, ids)

    def numbers(self, key: str, ids: np.ndarray, default: float = 0,
                dtype: str = "int64") -> np.ndarray:
        return self._answering(key, ids).numbers(key, ids, default, dtype)

    def texts(self, key: str, ids: np.ndarray) -> np.ndarray:
        return self._answering(key, ids).texts(key, ids)

    def text_column(self, key: str, ids: np.ndarray) -> Any:
        return self._answering(key, ids).text_column(key, ids)

    def text_codes(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
        return self._answering(key, ids).text_codes(key, ids)

    def _answering(self, key: str, ids: np.ndarray) -> SliceArgs:
        """What answers a question about `key`: the whole args once decoded, else that
        key's rows (none for no ids: nothing is read)."""
        if self.decoded is not None:
            return self.decoded
        if not len(ids):
            return _NO_ARGS
        with self._lock:
            found = self._by_key.get(key)
            if found is None:
                try:
                    if self._groups_read >= WHOLE_AFTER_PASSES * len(self._groups()):
                        # many keys of most slices (a first load's derived tables): one
                        # read of every row costs less than the file again for each key
                        self._by_key.clear()
                        self._keys = None
                        return self.resolved()
                    found = self._key_args(key)
                except StoredArgsUnreadable:
                    return self.resolved()
                self._keep(key, found)
            self._by_key.move_to_end(key)
            return found

    def _keep(self, key: str, rows: ColumnArgs) -> None:
        """Keep a key's rows, letting the least recently read go past KEPT_KEY_BYTES."""
        self._by_key[key] = rows
        size = sum(_nbytes(kept) for kept in self._by_key.values())
        while size > KEPT_KEY_BYTES and len(self._by_key) > 1:
            _, dropped = self._by_key.popitem(last=False)
            size -= _nbytes(dropped)

    def _key_args(self, key: str) -> ColumnArgs:
        codes, names, group_starts = self._key_codes()
        if key not in names:
            return _NO_ARGS
        rows = np.flatnonzero(codes == names.index(key))
        groups = np.unique(np.searchsorted(group_starts, rows, "right") - 1)
        return self._rows_of(groups.tolist(), rows, group_starts)

    def _key_codes(self) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Each row's key as a code into the keys' names, and where each row group starts."""
        if self._keys is None:
            from neuron_explorer.store.parquet import dictionary_codes

            groups = self._groups()
            table = self._read_groups(list(range(len(groups))), ["key"])
            if table is None:
                raise StoredArgsUnreadable
            codes, names = dictionary_codes(table.column("key"))
            del table
            small = np.uint8 if len(names) < 256 else np.uint16 if len(names) < 65536 else None
            codes = codes.astype(small) if small is not None else codes
            starts = np.cumsum([0] + [n for n, _, _ in groups])[:-1]
            self._keys = (codes, [str(k) for k in names], starts)
        return self._keys

    def _groups(self) -> list[tuple[int, int, int]]:
        if self._group_list is None:
            self._group_list = self._row_groups()
            if self._group_list is None:
                raise StoredArgsUnreadable
        return self._group_list

    def _rows_of(self, groups: list[int], rows: np.ndarray | None,
                 group_starts: np.ndarray | None) -> ColumnArgs:
        """ColumnArgs of the given rows of the file (all rows of `groups` where `rows` is
        None), read a row group at a time: a group's other rows are let go as it is read."""
        import pyarrow as pa
        from neuron_explorer.store.parquet import args_from_arrow

        parts = []
        self._groups_read += len(groups)
        for group in groups:
            table = self._read_groups([group], None)
            if table is None:
                raise StoredArgsUnreadable
            if rows is not None and group_starts is not None:
                start = group_starts[group]
                mine = rows[(rows >= start) & (rows < start + table.num_rows)] - start
                table = table.take(pa.array(mine))
            parts.append(table)
        if not parts:
            return _NO_ARGS
        return args_from_arrow(pa.concat_tables(parts), self._n)

    # --- a few keys of many slices ----------------------------------------------------
    def narrowed(self, keys: Collection[str], ids: np.ndarray) -> SliceArgs:
        """The rows of `keys` of the slices `ids`, read in one pass over the row groups
        that can hold them. A derived table asks half a dozen keys of millions of slices:
        a key at a time read the file each time, and decoding it whole (what a first
        load's derived tables came to) held every arg of a 20 M-slice trace at once."""
        if self.decoded is not None:
            return self.decoded
        ids = np.asarray(ids, np.int64)
        ids = ids[(ids >= 0) & (ids < self._n)]
        if not len(ids):
            return _NO_ARGS
        wanted = np.zeros(self._n + 1, bool)  # the last: what a slice id past them reads
        wanted[ids] = True
        with self._lock:
            try:
                return self._matching_rows(self._groups_holding(ids), set(keys), wanted)
            except StoredArgsUnreadable:
                return self.resolved()

    def in_parts(self, keys: Collection[str], ids: np.ndarray, rows: int
                 ) -> Iterator[tuple[SliceArgs, np.ndarray | None]]:
        """Runs of row groups of about `rows` rows of the file, each read once in file order:
        a recording's args lie in file order, which is not the slices' (a run of slice ids
        has rows in a dozen row groups), so parts by slice id would read each row group
        many times."""
        if self.decoded is not None:
            yield self.decoded, None
            return
        ids = np.asarray(ids, np.int64)
        ids = ids[(ids >= 0) & (ids < self._n)]
        wanted = np.zeros(self._n + 1, bool)
        wanted[ids] = True
        keys = set(keys)
        try:
            with self._lock:
                groups = self._groups_holding(ids) if len(ids) else []
            part: list[int] = []
            held = 0
            for at, group in enumerate(groups):
                part.append(group)
                held += self._groups()[group][0]
                if held >= rows or at == len(groups) - 1:
                    found = self._matching_rows(part, keys, wanted)
                    yield found, sorted_unique(found.slice_id)
                    part, held = [], 0
        except StoredArgsUnreadable:  # the rest from the whole args: a part read already
            whole = self.resolved()   # keeps its slices' keys, the first part's
            yield whole, sorted_unique(ids)

    def _matching_rows(self, groups: list[int], keys: set[str], wanted: np.ndarray
                       ) -> ColumnArgs:
        """ColumnArgs of the rows of `groups` whose key is in `keys` and whose slice is
        `wanted`, read a row group at a time (its other rows let go as it is read)."""
        import pyarrow as pa
        from neuron_explorer.store.parquet import args_from_arrow, dictionary_codes

        parts = []
        for group in groups:
            table = self._read_groups([group], None)
            if table is None:
                raise StoredArgsUnreadable
            codes, names = dictionary_codes(table.column("key"))
            key_wanted = np.asarray([str(name) in keys for name in names] + [False], bool)
            sid = table.column("slice_id").to_numpy()
            sid = np.where((sid >= 0) & (sid < self._n), sid, self._n)
            keep = key_wanted[codes] & wanted[sid]
            if keep.any():
                parts.append(table.filter(pa.array(keep)))
        if not parts:
            return _NO_ARGS
        return args_from_arrow(pa.concat_tables(parts), self._n)

    # --- a few slices' dicts ----------------------------------------------------------
    def dicts_of(self, ids: np.ndarray) -> list[dict[str, Any] | None]:
        if self.decoded is not None:
            return self.decoded.dicts_of(ids)
        ids = np.asarray(ids, np.int64)
        with self._lock:
            try:
                groups = self._groups_holding(ids)
                found = self._rows_of(groups, None, None) if groups else _NO_ARGS
            except StoredArgsUnreadable:
                return self.resolved().dicts_of(ids)
        return found.dicts_of(ids)

    def get(self, slice_id: int) -> dict[str, Any] | None:
        return self.dicts_of(np.array([slice_id]))[0]

    def has_args(self, ids: np.ndarray) -> np.ndarray:
        if self.decoded is not None:
            return self.decoded.has_args(ids)
        ids = np.asarray(ids, np.int64)
        has = np.zeros(len(ids), bool)
        with self._lock:
            try:
                groups = self._groups_holding(ids)
                table = self._read_groups(groups, ["slice_id"]) if groups else None
                if groups and table is None:
                    raise StoredArgsUnreadable
            except StoredArgsUnreadable:
                return self.resolved().has_args(ids)
        if table is not None:
            stored = np.unique(table.column("slice_id").to_numpy())
            has = np.isin(ids, stored)
        return has

    def _groups_holding(self, ids: np.ndarray) -> list[int]:
        """Row groups whose slice-id range holds any of `ids`."""
        wanted = np.sort(ids[ids >= 0])  # not np.unique: it hashes every id
        out = []
        for group, (_, low, high) in enumerate(self._groups()):
            at = np.searchsorted(wanted, low)
            if at < len(wanted) and wanted[at] <= high:
                out.append(group)
        return out


KEPT_KEY_BYTES = 128 << 20  # the keys' rows a trace keeps read
WHOLE_AFTER_PASSES = 2  # key reads that have read the file this often: decode it whole


def _nbytes(args: ColumnArgs) -> int:
    return sum(a.nbytes for a in (args.slice_id, args.key, args.kind, args.value, args.scode)
               if a is not None)


# the answer for a key no slice has, or for no slices
_NO_ARGS = ColumnArgs(np.zeros(0, np.int32), np.zeros(0, np.int32), [], np.zeros(0, np.int8),
                      np.zeros(0, np.int64), None, np.zeros(0, object), 0)
