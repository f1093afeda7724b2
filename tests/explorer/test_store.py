"""The trace store and cache: a reload reads Parquet and gives the same tables; stale,
corrupt and unwritable caches and traces that change are handled; convert writes the same
store explicitly; sql runs over the Parquet."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import neuron_explorer
import pandas as pd
import pytest
import scenarios
from neuron_explorer.cli import main as cli_main
from neuron_explorer.common.errors import TruncatedTraceWarning
from neuron_explorer.store import cache as trace_cache
from neuron_explorer.store.cache import CacheWarning, entry_folder
from synthetic import TraceBuilder

TABLES = ("slices", "args", "tracks", "counters", "flows", "steps", "ops", "kernels",
          "instructions", "modules")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(folder))
    return folder


def no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make parsing a trace file fail: a load that succeeds read the cache."""
    def refuse(*_a, **_k):
        raise AssertionError("the trace was parsed again")

    monkeypatch.setattr("neuron_explorer.trace.read_trace", refuse)


def assert_same(a: neuron_explorer.Trace, b: neuron_explorer.Trace) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(a.table(name), b.table(name), obj=name)
    assert a.slice_args.dicts() == b.slice_args.dicts()
    assert (a.metadata, a.skipped, a.source_format) == (b.metadata, b.skipped, b.source_format)
    assert {**a.summary(), "path": ""} == {**b.summary(), "path": ""}


def test_a_cached_traces_held_files_close_with_it(tmp_path: Path, cache_dir: Path) -> None:
    """The files a cached trace holds open (its lazily read tables) close when the trace
    goes, not in the collector with a ResourceWarning each."""
    import gc

    path = scenarios.basic().write(tmp_path, "basic", "pftrace")
    neuron_explorer.load(path)
    again = neuron_explorer.load(path)  # from the cache: its args and flows held open
    folder = again.store_folder
    assert folder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del again
        gc.collect()
    unclosed = [str(w.message) for w in caught
                if issubclass(w.category, ResourceWarning) and folder in str(w.message)]
    assert not unclosed, unclosed


@pytest.mark.parametrize("fmt", ["pftrace", "json"])
def test_reload_reads_the_cache_and_gives_the_same_tables(
        tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    path = scenarios.basic().write(tmp_path, "basic", fmt)
    fresh = neuron_explorer.load(path, cache=False)
    assert not cache_dir.exists()  # cache=False writes nothing
    first = neuron_explorer.load(path)
    assert first.store_folder == entry_folder(str(path), str(cache_dir))
    assert_same(fresh, first)
    with monkeypatch.context() as m:
        no_parsing(m)
        again = neuron_explorer.load(path)
        assert_same(fresh, again)
        assert again.path == str(path)


def test_the_args_table_is_the_same_whether_the_args_were_decoded_first(
        tmp_path: Path, cache_dir: Path) -> None:
    """A first load builds its args table from the decoded args, a reload reads it from
    the store: the same table either way."""
    path = scenarios.basic().write(tmp_path, "basic", "pftrace")
    want = neuron_explorer.load(path, cache=False).table("args")
    assert len(want)
    for decoded_first in (True, False, True):  # the first load (writes the cache), reloads
        t = neuron_explorer.load(path)
        if decoded_first:
            t.slice_args.get(0)
        pd.testing.assert_frame_equal(t.table("args"), want)


def test_the_args_tables_texts_are_codes_over_their_distinct_values(
        tmp_path: Path, cache_dir: Path) -> None:
    """The args' keys and strings are categoricals, fresh, cached, and from JSON: as
    strings, an engine-level trace's 16 M args rows took 2.7 GB, 4.1 GB at the load's peak
    (now 0.44 and 1.7). SQL over the frame still sees text."""
    traces = [scenarios.basic().write(tmp_path, "basic", "pftrace"),
              scenarios.basic().write(tmp_path, "basic_json", "json")]
    for path in traces:
        for cache in (False, True, True):  # parsed, the cache written, read back
            t = neuron_explorer.load(path, cache=cache)
            args = t.table("args")
            for column in ("key", "str_value"):
                assert isinstance(args[column].dtype, pd.CategoricalDtype), (path, column)
            texts = args.loc[args["str_value"].notna(), "str_value"]
            assert len(texts) and set(texts.cat.categories) == set(texts.astype(str))
            found = t.sql("SELECT key, str_value FROM args WHERE str_value IS NOT NULL")
            assert sorted(found["str_value"].astype(str)) == sorted(texts.astype(str))
            assert isinstance(found["key"].iloc[0], str)


def test_the_stored_args_texts_are_read_back_in_order_without_a_sort(
        tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The args file's key and str_value dictionaries are written as the tables hold them
    (the values used, in lexical order), so a cached read takes them as they are: re-sorting
    was 55 ms of each cached read of a 1 M-slice trace's args."""
    import pyarrow.parquet as pq
    from neuron_explorer.loaders import args as args_module

    path = scenarios.basic().write(tmp_path, "basic", "pftrace")
    want = neuron_explorer.load(path).table("args")  # the cache written
    folder = entry_folder(str(path), str(cache_dir))
    stored = pq.read_table(os.path.join(folder, "args.parquet"),
                           read_dictionary=["key", "str_value"])
    for column in ("key", "str_value"):
        dictionary = stored.column(column).chunk(0).dictionary.to_pylist()
        assert len(dictionary) > 1 and dictionary == sorted(set(dictionary)), column
    sorted_again = []
    monkeypatch.setattr(args_module, "categorical",
                        lambda *a: sorted_again.append(a) or pytest.fail("sorted again"))
    pd.testing.assert_frame_equal(neuron_explorer.load(path).table("args"), want)
    assert not sorted_again


def test_a_table_read_a_few_columns_at_a_time_is_the_table(
        tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached tables are read a few columns at a time (CELLS_PER_READ values): one column
    at a time, or all at once, the frames are the same."""
    from neuron_explorer.store import parquet

    path = scenarios.basic().write(tmp_path, "basic", "pftrace")
    assert len(neuron_explorer.load(path).kernels)  # the cache written
    frames = []
    for cells in (1, 10**9):  # a column a read, the whole table in one
        monkeypatch.setattr(parquet, "CELLS_PER_READ", cells)
        t = neuron_explorer.load(path)
        frames.append({name: t.table(name) for name in TABLES})
    for name in TABLES:
        pd.testing.assert_frame_equal(frames[0][name], frames[1][name], check_exact=True)
        assert len(frames[0][name].columns) and frames[0][name].columns.is_unique


def test_cache_off_by_environment(tmp_path: Path, cache_dir: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", "off")
    path = scenarios.basic().write(tmp_path, "basic")
    assert neuron_explorer.load(path).store_folder is None
    assert not cache_dir.exists()


def test_default_folder_is_under_xdg_cache_home(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURON_EXPLORER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = scenarios.basic().write(tmp_path, "basic")
    t = neuron_explorer.load(path)
    assert t.store_folder.startswith(str(tmp_path / "xdg" / "neuron-explorer"))


def two_traces(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """Two versions of one trace file of equal size: 2 steps, then 2 steps named apart."""
    path = scenarios.basic().write(tmp_path, "v1")
    first = path.read_bytes()
    sc = scenarios.basic()
    sc.b.slice(sc.host, 30_000, 10, "late", "annotation")  # a slice more at the end
    second = sc.write(tmp_path, "v2").read_bytes()
    return path, first, second


def test_a_changed_trace_is_read_again(tmp_path: Path, cache_dir: Path) -> None:
    path, _, second = two_traces(tmp_path)
    before = len(neuron_explorer.load(path).table("slices"))
    path.write_bytes(second)
    after = neuron_explorer.load(path)
    assert len(after.table("slices")) == before + 1
    assert len(neuron_explorer.load(path).table("slices")) == before + 1  # entry rebuilt


def test_a_rewrite_with_the_old_size_and_time_is_read_again(tmp_path: Path,
                                                            cache_dir: Path) -> None:
    path = scenarios.basic().write(tmp_path, "a")
    data = path.read_bytes()
    assert b"aten::relu" in data
    names = set(neuron_explorer.load(path).table("slices")["name"])
    st = path.stat()
    path.write_bytes(data.replace(b"aten::relu", b"aten::RELU"))  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old modification time
    reloaded = set(neuron_explorer.load(path).table("slices")["name"])
    assert "aten::relu" in names and "aten::RELU" in reloaded and "aten::relu" not in reloaded


def test_a_trace_changing_while_streamed_is_read_again_and_not_cached(
        tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _, second = two_traces(tmp_path)
    from neuron_explorer.store import streamed

    real_stream = streamed.stream_pftrace

    def stream_then_rewritten(p, folder):  # the recorder rewrites the file during the load
        decoded = real_stream(p, folder)
        Path(p).write_bytes(second)
        return decoded

    monkeypatch.setattr(streamed, "stream_pftrace", stream_then_rewritten)
    monkeypatch.setattr("neuron_explorer.loaders.STREAM_MIN_BYTES", 0)  # decoded in windows
    t = neuron_explorer.load(path)
    assert "late" in set(t.table("slices")["name"])  # the file as it is now, read whole
    assert t.store_folder is None
    assert not os.path.exists(entry_folder(str(path), str(cache_dir)))
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".build-")]


def test_a_trace_changing_while_read_is_not_cached(tmp_path: Path, cache_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path, _, second = two_traces(tmp_path)
    import neuron_explorer.trace as trace_module


    real_read = trace_module.read_trace

    def read_then_rewritten(p, **kw):  # the recorder rewrites the file during the load
        raw = real_read(p, **kw)
        Path(p).write_bytes(second)
        return raw

    monkeypatch.setattr(trace_module, "read_trace", read_then_rewritten)
    t = neuron_explorer.load(path)
    assert "late" not in set(t.table("slices")["name"])
    assert t.store_folder is None
    assert not os.path.exists(entry_folder(str(path), str(cache_dir)))
    monkeypatch.setattr(trace_module, "read_trace", real_read)
    assert "late" in set(neuron_explorer.load(path).table("slices")["name"])


@pytest.mark.parametrize("table", ["slices", "args", "trace.json", "ops"])
def test_a_corrupt_entry_is_rebuilt(tmp_path: Path, cache_dir: Path, table: str) -> None:
    path = scenarios.basic().write(tmp_path, "basic")
    fresh = neuron_explorer.load(path, cache=False)
    first = neuron_explorer.load(path)
    assert len(first.ops) == 6  # and written into the entry
    name = table if "." in table else f"{table}.parquet"
    target = Path(first.store_folder) / name
    target.write_bytes(b"PAR1 not parquet at all" * 3)
    assert_same(fresh, neuron_explorer.load(path))
    assert_same(fresh, neuron_explorer.load(path))  # and the rebuilt entry reads


def test_a_cut_entry_is_rebuilt(tmp_path: Path, cache_dir: Path) -> None:
    path = scenarios.basic().write(tmp_path, "basic")
    fresh = neuron_explorer.load(path, cache=False)
    folder = Path(neuron_explorer.load(path).store_folder)
    (folder / "counters.parquet").unlink()
    assert_same(fresh, neuron_explorer.load(path))


def test_an_unwritable_cache_loads_without_it(tmp_path: Path, cache_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("neuron_explorer.store.parquet.tempfile.mkdtemp", read_only)
    monkeypatch.setattr(trace_cache, "_warned", set())
    path = scenarios.basic().write(tmp_path, "basic")
    with pytest.warns(CacheWarning, match="cannot be written.*NEURON_EXPLORER_CACHE"):
        t = neuron_explorer.load(path)
    assert t.store_folder is None and len(t.ops) == 6
    assert_same(neuron_explorer.load(path, cache=False), t)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_cache_folder(tmp_path: Path, cache_dir: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_cache, "_warned", set())
    cache_dir.mkdir()
    cache_dir.chmod(0o500)
    try:
        path = scenarios.basic().write(tmp_path, "basic")
        with pytest.warns(CacheWarning):
            assert neuron_explorer.load(path).store_folder is None
    finally:
        cache_dir.chmod(0o700)


def test_warnings_are_heard_again_from_the_cache(tmp_path: Path, cache_dir: Path) -> None:
    b = TraceBuilder()
    host = b.thread()
    for i in range(50):
        b.slice(host, i * 100, 50, f"op{i}", "op", {"op_id": i})
    path = b.write_pftrace(tmp_path / "cut.pftrace", truncate=7)
    with pytest.warns(TruncatedTraceWarning):
        first = neuron_explorer.load(path)
    assert first.store_folder is not None
    with pytest.warns(TruncatedTraceWarning):
        again = neuron_explorer.load(path)
    assert again.warnings == first.warnings and again.warnings


def test_convert_writes_a_store_that_loads(tmp_path: Path, cache_dir: Path) -> None:
    path = scenarios.basic().write(tmp_path, "basic")
    out = tmp_path / "converted"
    assert cli_main(["convert", str(path), "-o", str(out), "--quiet"]) == 0
    assert {f"{t}.parquet" for t in TABLES} <= set(os.listdir(out))
    assert pd.read_parquet(out / "ops.parquet")["name"].tolist()[:2] == ["aten::mm",
                                                                           "aten::relu"]
    shutil.move(path, tmp_path / "gone.pftrace")  # the converted folder stands alone
    fresh = neuron_explorer.load(tmp_path / "gone.pftrace", cache=False)
    assert_same(fresh, neuron_explorer.load(out))
    assert cli_main(["convert", str(tmp_path / "gone.pftrace"), "-o", str(out)]) == 2


def test_sql_reads_the_parquet(tmp_path: Path, cache_dir: Path) -> None:
    path = scenarios.basic().write(tmp_path, "basic")
    fresh = neuron_explorer.load(path, cache=False)
    cached = neuron_explorer.load(path)
    query = ("SELECT s.name, count(*) AS n, sum(a.int_value) AS flops FROM slices s "
             "JOIN args a ON a.slice_id = s.id WHERE a.key = 'flops' GROUP BY 1 ORDER BY 1")
    pd.testing.assert_frame_equal(fresh.sql(query), cached.sql(query))
    assert cached.sql("SELECT count(*) AS n FROM ops")["n"].tolist() == [6]  # writes ops
    cached._slices = None  # the query must not need the frame: it reads the files
    cached.__dict__.pop("ops", None)
    assert cached.sql("SELECT count(*) AS n FROM slices")["n"].tolist() == [len(fresh.slices)]
    assert cached.sql("SELECT sum(flops) AS f FROM ops")["f"].tolist() == \
        [fresh.ops["flops"].sum()]


def test_an_open_trace_keeps_its_entry_when_another_load_rebuilds_it(
        tmp_path: Path, cache_dir: Path) -> None:
    """A notebook holds a trace read from its cache entry; the trace file changes and
    another load rebuilds the entry. The open trace's lazily read tables (args, the ops
    and kernels derived from them, SQL) stay those of the trace it opened."""
    path = scenarios.basic().write(tmp_path, "trace")
    before = neuron_explorer.load(path, cache=False)
    neuron_explorer.load(path)  # writes the entry
    held = neuron_explorer.load(path)  # from the entry: args and derived tables not read yet
    changed = scenarios.basic(steps=3)
    changed.b.slice(changed.host, 1, 5, "late", "op", {"op_id": 999, "step": 0})
    changed.write(tmp_path, "trace")
    os.utime(path, ns=(1, 1))  # a new size and time: the entry is stale
    rebuilt = neuron_explorer.load(path)
    assert len(rebuilt.steps) == 3
    assert len(rebuilt.ops) != len(before.ops)  # and the new entry holds its ops table
    assert_same(before, held)
    assert len(held.sql("select * from ops")) == len(before.ops)


@pytest.mark.parametrize("table", ["slices", "args", "tracks", "counters", "flows", "ops"])
def test_a_flipped_bit_in_an_entry_never_gives_other_rows(tmp_path: Path, cache_dir: Path,
                                                          table: str) -> None:
    """Every page of the entry's Parquet files is checksummed: a bit flipped anywhere in
    a table's data reads as damage (the entry is built again, or the table read from the
    trace again), never as other values."""
    path = scenarios.basic().write(tmp_path, "trace")
    fresh = neuron_explorer.load(path, cache=False)
    first = neuron_explorer.load(path)
    first.ops  # noqa: B018 - written into the entry
    target = Path(first.store_folder) / f"{table}.parquet"
    data = bytearray(target.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8  # metadata length + its frame
    for offset in range(4, len(data) - footer, max((len(data) - footer) // 12, 1)):
        flipped = bytearray(data)
        flipped[offset] ^= 0x10
        folder = Path(entry_folder(str(path), str(cache_dir)))
        (folder / f"{table}.parquet").write_bytes(bytes(flipped))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_same(fresh, neuron_explorer.load(path))
        neuron_explorer.load(path, cache=False)  # keep the entry as it is for the next flip
