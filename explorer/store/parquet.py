"""One trace's tables as Parquet files in a folder, and the folder read back.

The folder holds `trace.json` (format version, source file, metadata, what was
skipped, warnings) and one Parquet file per table: the loader's slices, tracks,
counters, flows and args (long form: one row per slice and key, typed columns),
and the derived steps, ops, kernels, instructions and modules as they are
computed. DuckDB, pandas or any Parquet reader can read the files directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.common.errors import TraceFormatWarning
from neuron_explorer.loaders.args import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_OTHER,
    KIND_STR,
    ColumnArgs,
    LazyArgs,
    SliceArgs,
    categorical,
    categorical_of,
    put_float_bits,
    tidy_categoricals,
)
from neuron_explorer.loaders.build_memory import building
from neuron_explorer.loaders.raw import RawTrace

FORMAT = "neuron-explorer-store"
# 2: PyTorch-profiler traces' args hold ours beside Kineto's; 3: build ids, checksums;
# 4: the slices' text columns categorical (dictionaries as they are)
VERSION = 4
MANIFEST = "trace.json"
RUN_MANIFEST = "run.json"  # a converted run: one store per rank beside it
BASE_TABLES = ("slices", "tracks", "counters", "flows", "args")
DERIVED_TABLES = ("steps", "ops", "kernels", "instructions", "modules")
ARGS_COLUMNS = ["slice_id", "key", "kind", "int_value", "float_value", "str_value"]
INT64 = (-(1 << 63), (1 << 63) - 1)
# rows per row group: the unit a lazy read (a key of the args, a few slices' dicts) reads
ROW_GROUP_ROWS = 1 << 20


class StoreError(Exception):
    """A store folder that cannot be used (missing, of another version, unreadable)."""


def is_store(folder: str | os.PathLike) -> bool:
    """Whether a folder is a trace's store (written by `convert` or the cache) or a
    converted run's folder."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in (MANIFEST, RUN_MANIFEST))


@dataclass
class Store:
    """A trace's store folder: its manifest and its tables' files.

    An open store is one build of the entry: the tables it reads lazily (args, flows)
    are held open from the start, so another process rebuilding the entry (a changed
    trace, a newer version) never mixes its tables into this one; any other table is
    read only when its file carries this build's id. Every page is checksummed, and a
    table whose pages do not match reads as unreadable, never as other rows."""

    folder: str
    manifest: dict[str, Any]
    pinned: dict[str, Any] = field(default_factory=dict)  # table -> its open file
    # a held file's footer, parsed once: read again at each row-group read, the footer
    # of an args file in 659 row groups took 5 ms a read, 25x the read itself
    footers: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the held files close with the store (left to the collector, each said
        # "ResourceWarning: unclosed file")
        weakref.finalize(self, _close_all, self.pinned)

    def file(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.parquet")

    def has(self, name: str) -> bool:
        return name in self.pinned or os.path.isfile(self.file(name))

    def read_table(self, name: str) -> pd.DataFrame | None:
        """A table of this build, or None when it is absent, unreadable, damaged or of
        another build (a derived table is then computed again and written over it)."""
        import pyarrow as pa

        # what the read decodes and lets go returns to the system
        with building(), self._parquet_file(name, ()) as file:
            if file is None:
                return None
            try:
                return _columns_to_pandas(file)
            except (OSError, pa.ArrowException, ValueError):
                return None

    def read_args(self, n_slices: int) -> ColumnArgs | None:
        """The slices' args as columns straight from the file's pages: keys and strings
        stay the codes Parquet's dictionaries hold, so no Python object is made per row
        (the long table's 2.4 M rows of a 1 M-slice trace took 0.4-1.2 s through pandas
        objects, and most of its memory). None as `read_table`."""
        import pyarrow as pa

        with building(), self._parquet_file("args", ("key", "str_value")) as file:
            if file is None:
                return None
            # a column at a time, each let go once converted: the whole Arrow table held
            # beside the arrays made of it took a cached 10 M-slice trace with its args
            # to 3.1 GB above the imports (2.3-2.8 GB this way)
            columns: dict[str, Any] = {}
            for column in ARGS_COLUMNS:
                try:
                    table = file.read(columns=[column])
                except (OSError, pa.ArrowException, ValueError):
                    return None
                if table.num_rows != file.metadata.num_rows:  # a damaged page header
                    return None
                columns[column] = table.column(column)
                del table
            return args_from_arrow(columns, n_slices)

    def pin(self, names: tuple[str, ...]) -> None:
        """Hold the files of `names` open (those present), checked to be this build's."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for name in names:
            try:
                f = open(self.file(name), "rb")  # noqa: SIM115 - held for the store's life
            except FileNotFoundError:
                continue
            try:
                build = build_of(pq.read_schema(f))
            except (OSError, pa.ArrowException, ValueError):
                build = None
            if build != self.manifest.get("build"):
                f.close()
                raise StoreError(f"{self.folder}: {name} is not of this build (the entry "
                                 "was rebuilt while it was opened)")
            self.pinned[name] = f


    def write_table(self, name: str, frame: pd.DataFrame) -> bool:
        """Add or replace one table (atomically); False when it cannot be written (a
        read-only folder, a column Parquet cannot hold, an entry rebuilt meanwhile): the
        caller goes on without."""
        import pyarrow as pa

        if not self.still_current():
            return False
        try:
            write_parquet(self.file(name), frame, self.manifest["build"])
        except (OSError, pa.ArrowException, ValueError, TypeError):
            return False
        return True

    def still_current(self) -> bool:
        """The folder still holds the build this Store read (not rebuilt meanwhile)."""
        try:
            return read_manifest(self.folder).get("build") == self.manifest.get("build")
        except StoreError:
            return False

    def raw(self, reparse: Callable[[], RawTrace] | None = None) -> RawTrace:
        """The loader's tables, as the trace's first load made them. Args and flows are
        read on first use; should their files prove unreadable then, `reparse()` (the
        source trace parsed again) gives them, else StoreError."""
        m = self.manifest
        tables = {name: self.read_table(name) for name in ("slices", "tracks", "counters")}
        missing = [name for name, frame in tables.items() if frame is None]
        if missing:
            raise StoreError(f"{self.folder}: cannot read {', '.join(missing)}")
        slices = tables["slices"]
        assert slices is not None  # checked above

        def flows() -> pd.DataFrame:
            frame = self.read_table("flows")
            if frame is not None:
                return frame
            source = self._reparsed(reparse, "flows").flows
            return source() if callable(source) else source

        return RawTrace(
            path=m["source"]["path"], source_format=m["source_format"],
            slices=tables["slices"], args=self.lazy_args(len(slices), reparse),
            tracks=tables["tracks"],
            counters=tables["counters"], flows=flows, metadata=m.get("metadata") or {},
            skipped=dict(m.get("skipped") or {}),
            warnings=[message for _, message in m.get("warnings") or []])

    def lazy_args(self, n_slices: int, reparse: Callable[[], RawTrace] | None
                  ) -> LazyArgs:
        """The args, read as they are asked for: a key, a few slices, or all of them (from
        the trace again, by `reparse`, should their file prove unreadable then)."""
        from neuron_explorer.store.stored_args import StoredArgs

        def whole() -> SliceArgs:
            columns = self.read_args(n_slices)
            if columns is not None:
                return columns
            again = self._reparsed(reparse, "args").args
            return again.resolved() if isinstance(again, LazyArgs) else again

        return StoredArgs(
            lambda groups, columns: self.read_row_groups("args", groups, columns,
                                                         ("key", "str_value")),
            lambda: self.row_group_ranges("args", "slice_id"), whole, n_slices)

    def read_row_groups(self, name: str, groups: list[int], columns: list[str] | None,
                        dictionaries: tuple[str, ...] = ()) -> Any:
        """Row groups of a table of this build as one Arrow table (checksums checked), or
        None as `read_table`."""
        import pyarrow as pa

        with self._parquet_file(name, dictionaries) as file:
            if file is None:
                return None
            try:
                table = file.read_row_groups(groups, columns=columns)
            except (OSError, pa.ArrowException, ValueError):
                return None
            # a damaged page header (outside the pages' checksums) can read as a column
            # cut short: a read of one column is checked against the footer's rows
            rows = sum(file.metadata.row_group(g).num_rows for g in groups)
            return table if table.num_rows == rows else None

    def row_group_ranges(self, name: str, column: str) -> list[tuple[int, int, int]] | None:
        """Each row group of a table: its rows and the lowest and highest value of a number
        column (from the file's statistics; unbounded where it has none), or None as
        `read_table`."""
        with self._parquet_file(name, ()) as file:
            if file is None:
                return None
            meta = file.metadata
            at = file.schema_arrow.get_field_index(column)
            out = []
            for i in range(meta.num_row_groups):
                group = meta.row_group(i)
                stats = group.column(at).statistics if at >= 0 else None
                low, high = ((stats.min, stats.max) if stats is not None and stats.has_min_max
                             else (INT64[0], INT64[1]))
                out.append((group.num_rows, low, high))
            return out

    @contextlib.contextmanager
    def _parquet_file(self, name: str, dictionaries: tuple[str, ...]) -> Any:
        """The table's file opened for reading row groups, if it is this build's; else None."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        source = self.pinned.get(name)
        if source is None and not os.path.isfile(self.file(name)):
            yield None
            return
        try:
            if source is not None:
                source.seek(0)
            file = pq.ParquetFile(source if source is not None else self.file(name),
                                  metadata=self.footers.get(name),
                                  page_checksum_verification=True,
                                  read_dictionary=list(dictionaries) or None)
        except (OSError, pa.ArrowException, ValueError):
            yield None
            return
        if source is not None:  # a held file never changes
            self.footers[name] = file.metadata
        try:
            yield file if build_of(file.schema_arrow) == self.manifest.get("build") else None
        finally:
            file.close()

    def _reparsed(self, reparse: Callable[[], RawTrace] | None, what: str) -> RawTrace:
        if reparse is None:
            raise StoreError(f"{self.folder}: cannot read {what}")
        from neuron_explorer.store.cache import CacheWarning

        warnings.warn(f"{self.folder}: the cached {what} are damaged or unreadable; they are "
                      "read from the trace again", CacheWarning, stacklevel=4)
        return reparse()

    def replay_warnings(self, stacklevel: int = 3) -> None:
        """Warn again what the first load warned (a truncated recording, parts left out)."""
        from neuron_explorer.common import errors

        for category, message in self.manifest.get("warnings") or []:
            cls = getattr(errors, category, TraceFormatWarning)
            if not (isinstance(cls, type) and issubclass(cls, Warning)):
                cls = TraceFormatWarning
            warnings.warn(message, cls, stacklevel=stacklevel)


def _close_all(files: dict[str, Any]) -> None:
    for f in files.values():
        f.close()


def read_manifest(folder: str) -> dict[str, Any]:
    """The folder's manifest, checked to be a store of this version."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{folder}: no readable {MANIFEST} ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{folder}: not a trace store")
    if manifest.get("version") != VERSION:
        raise StoreError(f"{folder}: store version {manifest.get('version')}, this "
                         f"neuron-explorer reads version {VERSION}")
    if not isinstance(manifest.get("source"), dict) or "source_format" not in manifest:
        raise StoreError(f"{folder}: the manifest lacks its source")
    return manifest


# The tables a trace reads after opening (on first use): held open from the start.
LAZY_TABLES = ("args", "flows")


def open_store(folder: str) -> Store:
    """A store folder, its manifest checked, its base tables present and the tables read
    later held open (`Store.pin`)."""
    manifest = read_manifest(folder)
    store = Store(folder, manifest)
    missing = [name for name in BASE_TABLES if not store.has(name)]
    if missing:
        raise StoreError(f"{folder}: {', '.join(missing)} missing")
    _check_footers(store)
    store.pin(LAZY_TABLES)
    return store


BUILD_KEY = b"neuron_explorer.build"  # each Parquet file's schema metadata: its build


def build_of(schema: Any) -> str | None:
    """The build id a table's file was written for (None: none recorded)."""
    value = (schema.metadata or {}).get(BUILD_KEY)
    return value.decode() if value is not None else None


def _check_footers(store: Store) -> None:
    """Each base table's Parquet footer reads and holds the rows the manifest says (cheap:
    the footers only); a derived table's that does not is removed, to be computed again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = store.manifest.get("rows") or {}
    for name in BASE_TABLES + DERIVED_TABLES:
        if not store.has(name):
            continue
        try:
            n = pq.read_metadata(store.file(name)).num_rows
            ok = name not in rows or n == rows[name]
        except (OSError, pa.ArrowException, ValueError):
            ok = False
        if ok:
            continue
        if name in BASE_TABLES:
            raise StoreError(f"{store.folder}: {name} is unreadable")
        with contextlib.suppress(OSError):
            os.remove(store.file(name))


def write_store(folder: str, raw: RawTrace, source: dict[str, Any],
                caught: list[tuple[str, str]] | None = None,
                derived: dict[str, pd.DataFrame] | None = None) -> Store:
    """Write a trace's store into `folder` (built beside it, then moved in place, so a
    reader never sees half a store); an older store there is replaced.

    `caught`: the warnings of the load, as (category name, message); `derived`: derived
    tables already computed. Raises OSError when the folder cannot be written.
    """
    import pyarrow as pa

    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
    build = uuid.uuid4().hex
    try:
        flows = raw.flows() if callable(raw.flows) else raw.flows
        args = args_table(raw.args, len(raw.slices))  # decodes them: warnings come now
        rows = {"args": len(args)}
        # written first and let go: the long args table is built for the file alone
        write_parquet(os.path.join(tmp, "args.parquet"), args, build)
        del args
        tables = {"slices": raw.slices, "tracks": raw.tracks, "counters": raw.counters,
                  "flows": flows, **(derived or {})}
        for name, frame in tables.items():
            write_parquet(os.path.join(tmp, f"{name}.parquet"), frame, build)
            rows[name] = len(frame)
        order = ["slices", "tracks", "counters", "flows", "args", *(derived or {})]
        manifest = build_manifest(build, source, raw, caught if caught is not None else
                                  [("TraceFormatWarning", w) for w in raw.warnings],
                                  {name: rows[name] for name in order})
        return move_in_built(tmp, folder, manifest)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"the tables cannot be written as Parquet ({exc})") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_manifest(build: str, source: dict[str, Any], raw: RawTrace,
                   caught: list[tuple[str, str]], rows: dict[str, int]) -> dict[str, Any]:
    """The manifest of a build of a trace's store (`caught`: the load's warnings as
    (category name, message); `rows`: each table's rows)."""
    return {"format": FORMAT, "version": VERSION, "build": build, "source": source,
            "source_format": raw.source_format, "metadata": _jsonable(raw.metadata),
            "skipped": dict(raw.skipped), "warnings": caught, "rows": rows}


def move_in_built(tmp: str, folder: str, manifest: dict[str, Any]) -> Store:
    """Write the manifest into the built folder `tmp`, put it at `folder` and open it."""
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    _move_in(tmp, folder)
    store = Store(folder, manifest)
    with contextlib.suppress(StoreError, OSError):  # another process's build won the race
        store.pin(LAZY_TABLES)
    return store


def _move_in(tmp: str, folder: str) -> None:
    """Put the built folder at `folder`, replacing an older one."""
    old = None
    if os.path.exists(folder):
        old = f"{tmp}.old"
        try:
            os.rename(folder, old)
        except FileNotFoundError:  # another process moved it meanwhile
            old = None
    try:
        os.rename(tmp, folder)
    except OSError:  # another process put its build there first: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def write_parquet(path: str, frame: pd.DataFrame | Any, build: str) -> None:
    """Write a frame (or an Arrow table) as one Parquet file, atomically."""
    import pyarrow as pa

    table = (frame if isinstance(frame, pa.Table)
             else pa.Table.from_pandas(frame, preserve_index=False))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with parquet_writer(tmp, table.schema, build) as writer:
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def parquet_writer(path: str, schema: Any, build: str) -> Any:
    """A Parquet writer of the store's files (for tables written a part at a time): the
    build id in the schema, and the encodings below."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = schema.with_metadata({**(schema.metadata or {}), BUILD_KEY: build.encode()})
    # dictionaries for the text columns only: numbers gain little from them (ids, times
    # are mostly distinct) and hashing every value costs more than compressing it; a
    # categorical's dictionary is written as it is (its order kept, nothing hashed)
    texts = [field.name for field in schema
             if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
             or pa.types.is_dictionary(field.type)]
    # min/max statistics for the numbers only (times, ids: what a query's range skips row
    # groups by); a text column's cost a fifth of the writing and skip nothing here
    numbers = [field.name for field in schema if field.name not in texts]
    # integers as deltas, bit-packed: ids and times mostly rise by small steps, so this
    # reads twice as fast as zstd over plain values (1 M slices and every table: 0.15 ->
    # 0.075 s of CPU) in files a third the size
    deltas = {field.name: "DELTA_BINARY_PACKED" for field in schema
              if pa.types.is_integer(field.type) and field.name not in texts}
    return pq.ParquetWriter(path, schema, compression="zstd",  # zstd: small files, fast reads
                            use_dictionary=texts, column_encoding=deltas or None,
                            write_statistics=numbers, write_page_checksum=True)


# Values read and converted at once: each read's Arrow form is let go once converted, so a
# read peaks near the frame plus this much (the whole Arrow table beside the frame peaked a
# cached 10 M-slice trace's slices at 2.3x their frame). A read costs about 1 ms besides its
# values: a column at a time took a 1 M-slice trace's tables 2.5x longer to read.
CELLS_PER_READ = 4_000_000


def _columns_to_pandas(file: Any) -> pd.DataFrame:
    """A frame of a Parquet file's table, read a few columns at a time (CELLS_PER_READ)."""
    rows = file.metadata.num_rows
    names = file.schema_arrow.names
    step = max(1, CELLS_PER_READ // max(rows, 1))
    columns: dict[str, pd.Series] = {}
    for at in range(0, len(names), step):
        part = file.read(columns=names[at:at + step])
        if part.num_rows != rows:  # a damaged page header: cut short
            raise ValueError(f"columns {names[at:at + step]} hold {part.num_rows} of "
                             f"{rows} rows")
        frame = _to_pandas(part)
        del part
        columns.update(frame.items())
        del frame
    # the columns as they are: one block each, not copied into a block per dtype
    return pd.DataFrame(columns, copy=False)


def _to_pandas(table: Any) -> pd.DataFrame:
    """A frame of the table. Columns written dictionary-encoded come back as categoricals
    (the text columns the tables hold as categoricals: Parquet's dictionary is their
    categories, no string made per row)."""
    # each column let go once converted (split_blocks: no consolidation copy): the read
    # peaks near the frame, not at the Arrow table and the frame together
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    del table
    return tidy_categoricals(frame, all_used=True)


def _jsonable(value: Any) -> Any:
    """The metadata as JSON keeps it (it came from JSON, so this is exact)."""
    return json.loads(json.dumps(value, default=str))


# --- args as a long table ---------------------------------------------------------------
def args_table(args: SliceArgs, n_slices: int) -> Any:
    """`args_frame` as an Arrow table for the store's file: from columnar args, the keys
    and strings go in as dictionaries over their codes, so no string is made per row and
    Parquet writes the dictionaries as they are instead of hashing every value again."""
    import pyarrow as pa

    inner = args._get() if isinstance(args, LazyArgs) else args
    if not isinstance(inner, ColumnArgs) or inner.scode is None or not len(inner.key):
        return pa.Table.from_pandas(args_frame(inner, n_slices), preserve_index=False)
    codes, values = _str_codes(inner)
    return pa.table({
        "slice_id": np.asarray(inner.slice_id, np.int64),
        "key": _dictionary(np.asarray(inner.key, np.int64), inner.names),
        "kind": np.asarray(inner.kind, np.int8), "int_value": np.asarray(inner.ival, np.int64),
        "float_value": np.asarray(inner.fval, np.float64),
        "str_value": _dictionary(codes, values)})


def _dictionary(codes: np.ndarray, values: list[Any]) -> Any:
    """A dictionary array of `values` indexed by `codes` (-1, or a None value: null), its
    dictionary the values used in lexical order (`categorical`'s): read back, the column is
    the categorical the tables hold as it is (re-sorting a 1 M-slice trace's 2.4 M args
    rows' keys and strings was 55 ms of every cached read of them)."""
    import pyarrow as pa

    cat = categorical(codes, values)
    indices = np.asarray(cat.codes, np.int32)
    # Parquet takes no null inside a dictionary: those rows are nulls of their own
    return pa.DictionaryArray.from_arrays(pa.array(indices, mask=indices < 0),
                                          pa.array(cat.categories.tolist(), pa.large_string()))


def args_frame(args: SliceArgs, n_slices: int) -> pd.DataFrame:
    """The args of every slice: one row per (slice, key), a typed value per row (ints,
    floats, strings apart; anything else as JSON text with kind `other`)."""
    inner = args._get() if isinstance(args, LazyArgs) else args
    if isinstance(inner, ColumnArgs):
        return _columns_frame(inner)
    return _dicts_frame(inner.dicts())


def _columns_frame(a: ColumnArgs) -> pd.DataFrame:
    # the keys and strings as categoricals: a code per row over the distinct values (as
    # strings, an engine-level trace's 16 M args rows took 2.7 GB)
    return pd.DataFrame({
        "slice_id": np.asarray(a.slice_id, np.int64),
        "key": categorical(a.key, a.names),
        "kind": np.asarray(a.kind, np.int8), "int_value": np.asarray(a.ival, np.int64),
        "float_value": np.asarray(a.fval, np.float64), "str_value": _str_values(a),
    }, columns=ARGS_COLUMNS, copy=False)  # the arrays as they are: a large trace's args


def _str_values(a: ColumnArgs) -> Any:
    """The str_value column, a categorical: strings, JSON text of other values, missing
    elsewhere; from the string codes when the args have them (no Python object per row)."""
    if a.scode is None or not len(a.scode):
        other = np.flatnonzero(a.kind == KIND_OTHER)
        sval = np.asarray(a.sval, object).copy()
        if len(other):
            sval[other] = [json.dumps(v, default=str) for v in sval[other].tolist()]
        return categorical_of(sval)
    return categorical(*_str_codes(a))


def _str_codes(a: ColumnArgs) -> tuple[np.ndarray, list[Any]]:
    """str_value as (codes, distinct values) from the args' string codes: strings, and
    other values as their JSON text; -1 (null) elsewhere."""
    assert a.scode is not None
    codes = a.scode.copy()
    values = [v if isinstance(v, str) else None for v in a.svalues.tolist()]
    other = np.flatnonzero(a.kind == KIND_OTHER)
    if len(other):  # nested values: the JSON text of each distinct one, once (a real trace
        # repeats a few input shapes over 100k ops)
        distinct, inverse = np.unique(codes[other], return_inverse=True)
        codes[other] = len(values) + inverse
        values += [json.dumps(a.svalues[c] if c >= 0 else None, default=str)
                   for c in distinct.tolist()]
    return codes, values


def _dicts_frame(items: list[dict[str, Any] | None]) -> pd.DataFrame:
    sid: list[int] = []
    keys: list[str] = []
    kinds: list[int] = []
    ivals: list[int] = []
    fvals: list[float] = []
    svals: list[str | None] = []
    for i, d in enumerate(items):
        if not d:
            continue
        for k, v in d.items():
            sid.append(i)
            keys.append(str(k))
            kind, iv, fv, sv = _typed(v)
            kinds.append(kind)
            ivals.append(iv)
            fvals.append(fv)
            svals.append(sv)
    return pd.DataFrame({
        "slice_id": np.asarray(sid, np.int64), "key": categorical_of(np.asarray(keys, object)),
        "kind": np.asarray(kinds, np.int8), "int_value": np.asarray(ivals, np.int64),
        "float_value": np.asarray(fvals, np.float64),
        "str_value": categorical_of(np.asarray(svals, object)),
    }, columns=ARGS_COLUMNS)


def _typed(v: Any) -> tuple[int, int, float, str | None]:
    if v is True or v is False:
        return KIND_BOOL, int(v), 0.0, None
    if v.__class__ is int and INT64[0] <= v <= INT64[1]:
        return KIND_INT, v, 0.0, None
    if v.__class__ is float:
        return KIND_FLOAT, 0, v, None
    if v.__class__ is str:
        return KIND_STR, 0, 0.0, v
    return KIND_OTHER, 0, 0.0, json.dumps(v, default=str)


def args_from_arrow(table: Any, n_slices: int) -> ColumnArgs:
    """ColumnArgs from the long args table as Arrow read it (a table, or its columns by
    name, each let go once converted), `key` and `str_value` dictionary-encoded: their
    codes are the columns' indices."""
    if not isinstance(table, dict):
        table = {name: table.column(name) for name in ARGS_COLUMNS}

    def numbers(name: str, dtype: Any) -> np.ndarray:
        return table.pop(name).to_numpy().astype(dtype, copy=False)

    key_codes, key_names = dictionary_codes(table.pop("key"))
    str_codes, str_values = dictionary_codes(table.pop("str_value"))
    kind = numbers("kind", np.int8)
    slice_id = _ids(table.pop("slice_id"))
    value = _merged_values(table.pop("int_value"), table.pop("float_value"), kind)
    values = np.empty(len(str_values), object)
    values[:] = str_values
    other = np.flatnonzero(kind == KIND_OTHER)
    if len(other):  # nested values: each distinct JSON text parsed once, its rows sharing
        # the value (as the parser's args keep them)
        distinct, inverse = np.unique(str_codes[other], return_inverse=True)
        parsed = np.empty(len(distinct), object)
        parsed[:] = [json.loads(str_values[c]) if c >= 0 else None for c in distinct.tolist()]
        str_codes = str_codes.copy()
        str_codes[other] = len(values) + inverse
        values = np.concatenate([values, parsed])
    return ColumnArgs(slice_id, key_codes, [str(k) for k in key_names], kind, value, None,
                      (str_codes, values), n_slices)


def _ids(column: Any) -> np.ndarray:
    """Slice ids as int32 where they fit, cast in Arrow: no int64 copy beside them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(column):
        bounds = pc.min_max(column).as_py()
        if bounds["min"] >= -(1 << 31) and bounds["max"] < (1 << 31):
            column = column.cast(pa.int32())
    return np.asarray(column.to_numpy())


def _merged_values(ints: Any, floats: Any, kind: np.ndarray) -> np.ndarray:
    """The int and float columns as `ColumnArgs.value` (the floats' bits in the float
    rows), a chunk at a time, each chunk let go once copied: the two columns and the
    result are never held whole at once beside each other."""
    value = np.empty(len(kind), np.int64)
    for column, is_float in ((ints, False), (floats, True)):
        chunks = column.chunks
        del column
        at = 0
        for i, chunk in enumerate(chunks):
            part = chunk.to_numpy(zero_copy_only=False)
            end = at + len(part)
            if is_float:
                put_float_bits(value[at:end], part, kind[at:end])
            else:
                value[at:end] = part
            chunks[i] = None  # let the Arrow chunk go
            at = end
    return value


def dictionary_codes(column: Any) -> tuple[np.ndarray, list[Any]]:
    """A dictionary-encoded Arrow column as (codes, -1 where null; its distinct values)."""
    import pyarrow as pa

    if not pa.types.is_dictionary(column.type):  # a file that kept no dictionary
        column = column.dictionary_encode()
    column = column.unify_dictionaries() if column.num_chunks > 1 else column
    chunks = column.chunks
    if not chunks:
        return np.zeros(0, np.int64), []
    values = chunks[0].dictionary.to_pylist()
    # int32, as the indices are: ColumnArgs keeps codes in 4 bytes
    codes = np.concatenate([c.indices.fill_null(-1).to_numpy().astype(np.int32)
                            for c in chunks])
    return codes, values
