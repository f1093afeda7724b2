"""A cached trace's args are read from its Parquet a key, or a few slices, at a time: the
answers are those of the whole args decoded, and a report decodes nothing it does not
ask for."""

from __future__ import annotations

import shutil
from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from neuron_explorer.loaders.args import ColumnArgs
from neuron_explorer.report import render_report
from neuron_explorer.store import parquet as store_parquet
from neuron_explorer.store.cache import CacheWarning
from neuron_explorer.store.stored_args import StoredArgs

ROOT = Path(__file__).parents[2]


@pytest.fixture
def cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An engine-level recording (NKI kernels) with a cache entry whose files hold row
    groups of 200 rows, so a key's rows and a selection's dicts span several."""
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store_parquet, "ROW_GROUP_ROWS", 200)
    path = tmp_path / "nki.pftrace"
    shutil.copy(ROOT / "sample_traces" / "nki_kernels.pftrace", path)
    neuron_explorer.load(path)  # writes the entry
    return path


def _stored(path: Path) -> tuple[neuron_explorer.Trace, StoredArgs, ColumnArgs]:
    trace = neuron_explorer.load(path)
    args = trace.slice_args
    assert isinstance(args, StoredArgs)
    store = trace._store
    assert store is not None
    whole = store.read_args(len(trace.table("slices")))
    assert whole is not None
    return trace, args, whole


@pytest.mark.slow  # 15-20 s in a CI run
def test_a_cached_report_decodes_only_the_keys_it_reads(cached: Path) -> None:
    fresh = neuron_explorer.load(cached, cache=False)
    trace, args, _ = _stored(cached)
    assert render_report(trace, "md") == render_report(fresh, "md")
    assert args.decoded is None  # the whole args were never decoded


def test_each_key_alone_answers_as_the_whole_args(cached: Path) -> None:
    trace, args, whole = _stored(cached)
    n = len(trace.table("slices"))
    groups = store_parquet.Store.row_group_ranges(trace._store, "args", "slice_id")
    assert groups is not None and len(groups) > 3  # several row groups to read across
    rng = np.random.default_rng(7)
    ids = np.r_[rng.permutation(n)[: n // 2], n + 5, 0, 0]  # unordered, repeated, absent
    for key in [*whole.names, "no such key"]:
        assert args.column(key, ids).tolist() == whole.column(key, ids).tolist(), key
        assert np.array_equal(args.numbers(key, ids, -1, "float64"),
                              whole.numbers(key, ids, -1, "float64"), equal_nan=True), key
        assert args.texts(key, ids).tolist() == whole.texts(key, ids).tolist(), key
        codes, values = args.text_codes(key, ids)
        want_codes, want_values = whole.text_codes(key, ids)
        assert [values[c] for c in codes] == [want_values[c] for c in want_codes], key
        assert args.column(key, ids[:0]).tolist() == []
    assert args.dicts_of(ids) == whole.dicts_of(ids)
    known = ids[ids < n]  # has_args takes slice ids only
    assert np.array_equal(args.has_args(known), whole.has_args(known))
    assert args.decoded is None


def test_a_few_slices_dicts_read_only_their_row_groups(cached: Path) -> None:
    trace, args, whole = _stored(cached)
    read: list[list[int]] = []
    reader = args._read_groups

    def counting(groups: list[int], columns: list[str] | None):
        read.append(list(groups))
        return reader(groups, columns)

    args._read_groups = counting
    some = np.flatnonzero(whole.has_args(np.arange(len(trace.table("slices")))))[:3]
    assert args.dicts_of(some) == whole.dicts_of(some)
    assert args.get(int(some[0])) == whole.get(int(some[0]))
    assert read and all(len(groups) == 1 for groups in read)  # one group each, not all


def test_damaged_args_read_a_key_from_the_trace_again(cached: Path) -> None:
    """A flipped bit in the keys' pages: the key read finds the damage (each page's
    checksum) and the args come from the trace again, with a warning, never as other
    values."""
    import pyarrow.parquet as pq

    fresh = neuron_explorer.load(cached, cache=False)
    trace = neuron_explorer.load(cached)
    target = Path(str(trace.store_folder)) / "args.parquet"
    chunk = pq.ParquetFile(target).metadata.row_group(1).column(1)  # the key column's
    assert chunk.path_in_schema == "key"
    data = bytearray(target.read_bytes())
    start = (chunk.dictionary_page_offset if chunk.has_dictionary_page
             else chunk.data_page_offset)
    data[start + chunk.total_compressed_size // 2] ^= 0x10
    target.write_bytes(bytes(data))
    damaged = neuron_explorer.load(cached)
    ids = np.arange(len(fresh.table("slices")))
    with pytest.warns(CacheWarning, match="args are damaged"):
        values = damaged.slice_args.column("op_id", ids)
    assert values.tolist() == fresh.slice_args.column("op_id", ids).tolist()
    for key in ("kernel_id", "engine", "bytes"):
        assert damaged.slice_args.column(key, ids).tolist() == \
            fresh.slice_args.column(key, ids).tolist(), key


def test_keys_read_are_kept_within_their_budget(cached: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_explorer.store import stored_args

    trace, args, whole = _stored(cached)
    ids = np.arange(len(trace.table("slices")))
    monkeypatch.setattr(stored_args, "KEPT_KEY_BYTES", 1)
    monkeypatch.setattr(stored_args, "WHOLE_AFTER_PASSES", 1000)
    for key in ("op_id", "kernel_id", "bytes"):
        assert args.column(key, ids).tolist() == whole.column(key, ids).tolist()
    assert list(args._by_key) == ["bytes"]  # the last read only, past the budget


def test_many_keys_of_every_slice_decode_the_args_once(
        cached: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the key reads have read the file's row groups WHOLE_AFTER_PASSES times over,
    the whole args are decoded once rather than the file read again for each key."""
    from neuron_explorer.store import stored_args

    monkeypatch.setattr(stored_args, "WHOLE_AFTER_PASSES", 0.5)
    trace, args, whole = _stored(cached)
    ids = np.arange(len(trace.table("slices")))
    for key in whole.names:
        assert args.column(key, ids).tolist() == whole.column(key, ids).tolist(), key
    assert args.decoded is not None
    assert args._groups_read < len(args._groups())  # decoded whole, not read per key
    assert not args._by_key  # what the key reads kept is let go


def _reads_counted(args: StoredArgs) -> list[int]:
    """The row groups `args` reads from now on, as a list filled as it reads them."""
    read: list[int] = []
    reader = args._read_groups

    def counting(groups: list[int], columns: list[str] | None):
        read.extend(groups)
        return reader(groups, columns)

    args._read_groups = counting  # type: ignore[method-assign]
    return read


def test_narrowed_args_answer_for_their_keys_and_slices_in_one_pass(cached: Path) -> None:
    trace, args, whole = _stored(cached)
    n = len(trace.table("slices"))
    read = _reads_counted(args)
    ids = np.r_[np.random.default_rng(3).permutation(n)[: n // 3], n + 5, -1]
    keys = ("bytes", "kernel_id", "engine", "no such key")
    narrow = args.narrowed(keys, ids)
    assert sorted(read) == sorted(set(read))  # each row group read once at most
    for key in keys:
        assert narrow.column(key, ids).tolist() == whole.column(key, ids).tolist(), key
        assert np.array_equal(narrow.numbers(key, ids, -1), whole.numbers(key, ids, -1)), key
        codes, values = narrow.text_codes(key, ids)
        want_codes, want_values = whole.text_codes(key, ids)
        assert [values[c] for c in codes] == [want_values[c] for c in want_codes], key
    held = narrow.numbers("bytes", np.arange(n), -1)  # other slices: not read
    assert (held[np.isin(np.arange(n), ids, invert=True)] == -1).all()
    assert args.narrowed(keys, np.array([-1, n + 1])).column("bytes", ids).tolist() == [
        None] * len(ids)
    assert args.decoded is None


@pytest.mark.slow  # 15-20 s in a CI run
def test_derived_tables_of_a_stored_trace_read_their_args_in_parts(
        cached: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The derived tables a stored trace computes (a first load's, built from its new
    entry) equal those of the trace in memory: its instructions' args read in parts, each
    row group once, the args never decoded whole."""
    from neuron_explorer import tables
    from neuron_explorer.loaders.args import tidy_categoricals

    fresh = neuron_explorer.load(cached, cache=False)
    trace, args, _ = _stored(cached)
    read = _reads_counted(args)
    parts: list[int] = []
    in_parts = StoredArgs.in_parts

    def counted_parts(self, keys, ids, rows):
        for part, held in in_parts(self, keys, ids, rows):
            parts.append(len(held))
            yield part, held

    monkeypatch.setattr(StoredArgs, "in_parts", counted_parts)
    monkeypatch.setattr(tables, "INSTRUCTION_ARGS_PER_READ", 3000)
    got = tidy_categoricals(tables.derive_instructions(trace))
    pd.testing.assert_frame_equal(got, fresh.instructions, obj="instructions")
    assert len(parts) > 3 and sorted(read) == sorted(set(read))
    for name in ("steps", "kernels", "ops", "modules"):
        got = tidy_categoricals(getattr(tables, f"derive_{name}")(trace))
        pd.testing.assert_frame_equal(got, getattr(fresh, name), obj=name)
    assert args.decoded is None
