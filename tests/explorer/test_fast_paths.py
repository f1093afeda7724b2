"""The fast paths give the answers of the plain ones: typed arg columns, per-distinct-value
maps, factorised kinds, evidence picked before it is built, small pages while loading and
freed memory given back after."""

from __future__ import annotations

import os
import sys

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from neuron_explorer.loaders import build_memory
from neuron_explorer.loaders.args import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_STR,
    ColumnArgs,
    DictArgs,
    SliceArgs,
)
from neuron_explorer.loaders.build_memory import _switch, building
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import top
from neuron_explorer.tables import flag, kind_codes, kind_mask, map_unique, text


def _mixed_args() -> tuple[ColumnArgs, DictArgs]:
    """Six slices; keys holding ints only, ints and floats, strings, mixed kinds, bools."""
    rows = [  # (slice, key, kind, value)
        (0, "n", KIND_INT, 7), (2, "n", KIND_INT, -3), (5, "n", KIND_INT, 2**60),
        (1, "x", KIND_FLOAT, 2.5), (3, "x", KIND_INT, 4),
        (0, "s", KIND_STR, "a"), (4, "s", KIND_STR, None), (5, "s", KIND_STR, "c"),
        (1, "m", KIND_STR, "12"), (2, "m", KIND_INT, 5), (3, "m", KIND_STR, "zz"),
        (0, "b", KIND_BOOL, 1), (2, "b", KIND_BOOL, 0), (3, "b", KIND_INT, 1),
    ]
    names = ["n", "x", "s", "m", "b"]
    n = len(rows)
    kind = np.array([r[2] for r in rows], np.int8)
    ival = np.array([r[3] if r[2] in (KIND_INT, KIND_BOOL) else 0 for r in rows], np.int64)
    fval = np.array([r[3] if r[2] == KIND_FLOAT else 0.0 for r in rows], np.float64)
    sval = np.empty(n, object)
    sval[:] = [r[3] if r[2] == KIND_STR else None for r in rows]
    cols = ColumnArgs(np.array([r[0] for r in rows], np.int64),
                      np.array([names.index(r[1]) for r in rows], np.int64), names, kind,
                      ival, fval, sval, 6)
    return cols, DictArgs(cols.dicts())


@pytest.mark.parametrize("key", ["n", "x", "s", "m", "b", "absent"])
@pytest.mark.parametrize("default, dtype", [(0, "int64"), (-1, "int64"), (0.0, "float64")])
def test_typed_numbers_match_the_plain_conversion(key: str, default: float, dtype: str) -> None:
    cols, plain = _mixed_args()
    ids = np.array([5, 0, 1, 2, 3, 4, 0], np.int64)
    got = cols.numbers(key, ids, default, dtype)
    want = SliceArgs.numbers(plain, key, ids, default, dtype)
    assert got.dtype == np.dtype(dtype)
    if key == "n":  # the typed path keeps 2**60 exact where objects went through float64
        assert got.tolist()[0] == 2**60
        got, want = got[1:], want[1:]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("key", ["n", "x", "s", "m", "b", "absent"])
def test_typed_texts_and_flags_match_the_plain_conversion(key: str) -> None:
    cols, plain = _mixed_args()
    ids = np.arange(6)
    assert cols.texts(key, ids).tolist() == text(plain.column(key, ids)).tolist()
    assert cols.texts(key, ids).tolist() == SliceArgs.texts(plain, key, ids).tolist()
    one_by_one = [v is True or v == 1 or str(v).lower() == "true"
                  for v in plain.column(key, ids).tolist()]
    assert flag(cols.column(key, ids)).tolist() == one_by_one


def test_args_hold_their_index_in_four_bytes_and_one_number_a_row() -> None:
    """An engine-level trace holds tens of millions of args rows: ids, key and string
    codes as int32 and the int and float columns as one column of 8 bytes, every value
    kept (the float rows' bits, NaN and -0.0 included), written back as two columns."""
    floats = [2.5, -0.0, float("nan"), float("inf"), -1e300]
    kind = np.array([KIND_INT, KIND_BOOL, KIND_STR] + [KIND_FLOAT] * len(floats), np.int8)
    ival = np.array([-(2**63), 1, 0] + [0] * len(floats), np.int64)
    fval = np.array([0.0, 0.0, 0.0] + floats, np.float64)
    n = len(kind)
    args = ColumnArgs(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64),
                      [f"k{i}" for i in range(n)], kind, ival.copy(), fval,
                      (np.where(kind == KIND_STR, 0, -1), np.array(["s"], object)), n)
    assert args.slice_id.dtype == args.key.dtype == np.int32
    assert args.scode is not None and args.scode.dtype == np.int32
    assert args.value.dtype == np.int64 and len(args.value) == n
    np.testing.assert_array_equal(args.ival, ival)  # what the store writes
    np.testing.assert_array_equal(args.fval, fval)
    ids = np.arange(n)
    assert args.get(0) == {"k0": -(2**63)} and args.get(1) == {"k1": True}
    got = [args.get(i)[f"k{i}"] for i in range(3, n)]
    assert got[0] == 2.5 and str(got[1]) == "-0.0" and np.isnan(got[2])
    assert got[3:] == [float("inf"), -1e300]
    assert args.numbers("k3", ids, -1, "float64")[3] == 2.5
    # ids past int32 (or negative) name no slice: searched, not wrapped around
    far = np.array([3 + (1 << 32), -1, 3], np.int64)
    assert args.column("k3", far).tolist() == [None, None, 2.5]
    assert args.dicts_of(far) == [None, None, {"k3": 2.5}]


@pytest.mark.parametrize("in_slice_order", [True, False])
def test_args_index_only_the_keys_asked_for(in_slice_order: bool) -> None:
    """A key's rows are found when it is first asked for, and only its rows are held: an
    index of every key at once was a cached 10 M-slice report's peak (it asks for a few).
    Rows need not come in slice order; a key's values are found either way."""
    slice_id = np.array([0, 0, 1, 2, 2, 3], np.int64)
    key = np.array([0, 1, 0, 1, 2, 0], np.int64)
    value = np.array([10, 20, 11, 21, 30, 13], np.int64)
    if not in_slice_order:
        slice_id, key, value = slice_id[::-1].copy(), key[::-1].copy(), value[::-1].copy()
    n = len(slice_id)
    args = ColumnArgs(slice_id, key, ["a", "b", "c"], np.full(n, KIND_INT, np.int8), value,
                      None, (np.full(n, -1), np.empty(0, object)), 4)
    ids = np.array([3, 0, 1, 2, 7])
    assert args.numbers("a", ids, -1).tolist() == [13, 10, 11, -1, -1]
    assert args._rows is not None and set(args._rows) == {0}  # "b" and "c" not indexed
    assert args.column("b", ids).tolist() == [None, 20, None, 21, None]
    assert set(args._rows) == {0, 1}
    assert args.numbers("nothing", ids, -1).tolist() == [-1] * 5


def test_typed_columns_of_a_loaded_trace(basic_pf: neuron_explorer.Trace) -> None:
    args = basic_pf.slice_args._get()
    ids = basic_pf.table("slices")["id"].to_numpy()
    for key in args.names:
        np.testing.assert_array_equal(args.numbers(key, ids, -1),
                                      SliceArgs.numbers(args, key, ids, -1))
        assert args.texts(key, ids).tolist() == SliceArgs.texts(args, key, ids).tolist()


def test_map_unique_calls_once_per_value() -> None:
    values = pd.Series(["dma0", "tensor", None, "dma1", "tensor", np.nan, "dma0"], dtype=object)
    calls: list[object] = []

    def family(v: object) -> object:
        calls.append(v)
        return "dma" if str(v).startswith("dma") else v

    got = map_unique(values, family)
    assert got.tolist()[:5] == ["dma", "tensor", None, "dma", "tensor"]
    assert len(calls) == len(set(map(str, values.tolist())))
    mask = map_unique(values, lambda v: str(v).startswith("dma"), bool)
    assert mask.dtype == bool and mask.tolist() == [True, False, False, True, False, False, True]
    assert map_unique(np.zeros(0, object), str.upper, bool).shape == (0,)


def test_map_unique_of_a_categorical_reads_its_codes() -> None:
    """A categorical column (a subset of the slices' names keeps every name as a
    category): the function sees the categories in use once each and NaN once for the
    missing values, and the result is the object path's."""
    names = pd.Categorical(["dma0", "tensor", None, "dma1", "tensor", "dma0"],
                           categories=["unused", "dma0", "tensor", "dma1"])
    for values in (names, pd.Series(names), pd.Series(names)[1:3]):
        calls: list[object] = []

        def family(v: object, calls: list[object] = calls) -> object:
            calls.append(v)
            return "dma" if str(v).startswith("dma") else str(v)

        got = map_unique(values, family)
        want = map_unique(np.asarray(values, dtype=object), family)
        assert got.tolist() == want.tolist()
        assert "unused" not in calls
        mask = map_unique(values, lambda v: str(v).startswith("dma"), bool)
        assert mask.tolist() == [str(v).startswith("dma") for v in np.asarray(values, object)]
    assert map_unique(pd.Categorical([]), str.upper, bool).shape == (0,)


def test_kind_mask_matches_isin(basic_trace: neuron_explorer.Trace) -> None:
    kinds = basic_trace.table("slices")["kind"]
    for wanted in [("op",), ("kernel", "memcpy", "memset"), ("no such kind",)]:
        assert kind_mask(basic_trace, wanted).tolist() == kinds.isin(wanted).tolist()


def test_kind_codes_are_the_categoricals_own_and_counts_leave_out_unused_kinds(
        basic_trace: neuron_explorer.Trace) -> None:
    from neuron_explorer.analyses.summary import _kind_counts

    kinds = basic_trace.table("slices")["kind"]
    assert isinstance(kinds.dtype, pd.CategoricalDtype)
    codes, _ = kind_codes(basic_trace)
    assert codes.dtype.itemsize == 1  # a byte a slice, not a factorised int64
    want = kinds.astype(str).value_counts()
    counts = _kind_counts(basic_trace)
    assert counts == {k: int(want[k]) for k in counts} and set(counts) == set(want.index)
    assert list(counts.values()) == sorted(counts.values(), reverse=True)
    # a kind the categorical lists but no slice has (a selection of a trace) is no count
    selection = _Slices(kinds.cat.add_categories(["unused kind"]))
    assert "unused kind" in list(kind_codes(selection)[1])
    assert _kind_counts(selection) == counts


class _Slices:
    """A stand-in trace whose slices are only a kind column."""

    def __init__(self, kinds: pd.Series) -> None:
        self._frame = pd.DataFrame({"kind": kinds})

    def table(self, name: str) -> pd.DataFrame:
        return self._frame


def test_top_keeps_the_rows_a_full_sort_would() -> None:
    frame = pd.DataFrame({"dur": [5, 9, 1, 9, 7, 3, 8, 2], "id": range(8)})
    assert len(frame) > th.MAX_EVIDENCE
    want = frame.sort_values("dur", ascending=False)["id"].tolist()[: th.MAX_EVIDENCE]
    assert top(frame, "dur")["id"].tolist() == want
    assert top(frame)["id"].tolist() == list(range(th.MAX_EVIDENCE))


@pytest.mark.skipif(_switch() is None, reason="this numpy has no huge-page switch")
def test_building_restores_the_page_setting() -> None:
    switch = _switch()
    before = switch(True)
    try:
        with building():
            assert switch(False) is False  # off inside
        assert switch(True) is True  # back on after
        with pytest.raises(RuntimeError), building():
            raise RuntimeError("boom")
        assert switch(True) is True
    finally:
        switch(before)


def test_the_outermost_build_gives_freed_memory_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load's parse, its cache writing and each analysis are builds, nested; the heap's
    free pages go back to the system once, as the outermost ends (also when it raises)."""
    given: list[int] = []
    monkeypatch.setattr(build_memory, "give_back_freed_memory", lambda: given.append(1))
    with building():
        with building():
            pass
        assert given == []
    assert given == [1]
    with pytest.raises(RuntimeError), building():
        raise RuntimeError("boom")
    assert given == [1, 1]


def test_builds_pause_the_cyclic_collector_and_restore_it() -> None:
    """Off from the outermost build's start to its end, nested builds included; back as it
    was found (on, or off where the caller had turned it off), also after a raise."""
    import gc

    assert gc.isenabled()
    with building():
        assert not gc.isenabled()
        with building():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer build still runs
    assert gc.isenabled()
    with pytest.raises(RuntimeError), building():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with building():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.skipif(build_memory._malloc_trim() is None, reason="not glibc")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    """Arrays below glibc's mmap threshold live in the heap; freed, their pages stay
    resident until trimmed."""
    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    with building():
        arrays = [np.ones(8_000, np.float64) for _ in range(8_000)]  # 64 KiB each: heap
        kept = arrays[-1]  # the heap's top stays in use: only a trim can give the rest back
        del arrays
        held = resident()
    assert held - resident() > 256 << 20  # of the 512 MiB freed
    assert kept.sum() == 8_000


def test_arrows_pool_gives_its_free_memory_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Parquet reads decode into Arrow's pool (mimalloc), which keeps what it frees."""
    released: list[int] = []

    class Pool:
        def release_unused(self) -> None:
            released.append(1)

    class Arrow:
        @staticmethod
        def default_memory_pool() -> Pool:
            return Pool()

    monkeypatch.setitem(sys.modules, "pyarrow", Arrow)
    build_memory.give_back_freed_memory()
    assert released == [1]


def test_nested_arg_values_keep_their_own_value_whichever_text_tells_them_apart() -> None:
    """Equal nested values share one stored value; values orjson would write alike (NaN and
    null), or cannot write (past 64 bits, floats keeping their digits), stay apart."""
    from neuron_explorer.loaders.args import ArgsBuilder
    from neuron_explorer.loaders.chrome_json import _Written

    values = [[1, 2], [float("nan")], [None], [1 << 70], [_Written(1.5)], ["1.5"], [1.5],
              {"b": 1, "a": [2]}, {"a": [2], "b": 1}, [1, 2], [1.0, 2]]
    builder = ArgsBuilder()
    builder.add(0, [{"v": v} for v in values])
    args = builder.build(len(values))
    got = [args.get(i)["v"] for i in range(len(values))]
    for value, back in zip(values, got, strict=True):
        assert back == value or repr(back) == repr(value)  # NaN is no NaN's equal
        assert type(back[0] if isinstance(back, list) else back) is \
            type(value[0] if isinstance(value, list) else value)
    scode = args.scode
    assert scode is not None
    assert scode[0] == scode[9]  # [1, 2] twice: one stored value
    assert scode[7] == scode[8]  # the same object, keys in another order
    assert len(set(scode.tolist())) == len(values) - 2
