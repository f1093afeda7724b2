"""`trace.slices["args"]`: the dict of each row's args, the same as the trace's args in
every pandas operation users make on it, and made only for the rows read."""

from __future__ import annotations

import pickle
from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from neuron_explorer.args_column import ArgsArray
from neuron_explorer.loaders.args import ColumnArgs, LazyArgs

SAMPLES = Path(__file__).parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def trace() -> neuron_explorer.Trace:
    return neuron_explorer.load(SAMPLES / "near_memory.pftrace")


def _expected(trace: neuron_explorer.Trace) -> list:
    """Every slice's args by the trace's own per-slice lookup."""
    return [trace.slice_args.get(i) for i in range(len(trace.table("slices")))]


def test_each_row_reads_its_slices_args(trace) -> None:
    sl, expected = trace.slices, _expected(trace)
    assert isinstance(sl["args"].array, ArgsArray)
    assert list(sl["args"]) == expected and sl["args"].tolist() == expected
    assert [sl["args"].iloc[i] for i in (0, 7, len(sl) - 1)] == \
        [expected[i] for i in (0, 7, len(sl) - 1)]
    assert sl["args"].isna().tolist() == [a is None for a in expected]
    ops = sl[sl["kind"] == "op"]
    assert ops["args"].tolist() == [expected[i] for i in ops["id"]]
    assert all(a["op_id"] > 0 for a in ops["args"])
    # a function of the args gives plain values, not args
    op_ids = ops["args"].apply(lambda a: a["op_id"])
    assert op_ids.dtype == np.int64 and op_ids.tolist() == [a["op_id"] for a in ops["args"]]
    assert sl["args"].args.get("op_id").tolist() == \
        [(a or {}).get("op_id") for a in expected]


def test_pandas_operations_move_rows_with_their_args(trace) -> None:
    sl, expected = trace.slices, _expected(trace)
    by_dur = sl.sort_values("dur", kind="stable")
    assert by_dur["args"].tolist() == [expected[i] for i in by_dur["id"]]
    joined = sl.merge(trace.ops[["id"]].rename(columns={"id": "op_slice"}), left_on="id",
                      right_on="op_slice")
    assert joined["args"].tolist() == [expected[i] for i in joined["id"]]
    both = pd.concat([sl.iloc[:3], sl.iloc[-2:]], ignore_index=True)
    assert both["args"].tolist() == expected[:3] + expected[-2:]
    records = sl.iloc[:4].to_dict("records")
    assert [r["args"] for r in records] == expected[:4]
    first = sl.groupby("kind", observed=True)["args"].first()
    assert first["op"] == next(a for a, k in zip(expected, sl["kind"], strict=True)
                               if k == "op")
    restored = pickle.loads(pickle.dumps(sl.iloc[10:40]))
    pd.testing.assert_frame_equal(restored, sl.iloc[10:40])
    assert "{'op_id': " in sl[sl["kind"] == "op"].head(2).to_string()


def test_two_traces_args_concatenate_as_dicts(trace) -> None:
    other = neuron_explorer.load(SAMPLES / "odd_dims.pftrace")
    both = pd.concat([trace.slices.iloc[:2], other.slices.iloc[:2]])
    assert both["args"].tolist() == _expected(trace)[:2] + _expected(other)[:2]


def test_a_write_changes_that_frame_only(trace) -> None:
    sl = trace.slices.copy()
    sl.at[3, "args"] = {"note": 1}
    assert sl["args"].iloc[3] == {"note": 1}
    assert trace.slices["args"].iloc[3] == trace.slice_args.get(3) != {"note": 1}


def test_reading_a_few_rows_makes_only_their_dicts() -> None:
    """A trace's slices frame and a selection of it build no dict until rows are read,
    and then those rows' only."""
    made: list[np.ndarray] = []

    class Counting(ColumnArgs):
        def dicts_of(self, ids):
            made.append(np.asarray(ids))
            return super().dicts_of(ids)

    n = 100_000
    slice_id = np.repeat(np.arange(n), 2)
    args = Counting(slice_id, np.tile([0, 1], n), ["a", "b"], np.zeros(2 * n, np.int8),
                    np.arange(2 * n), np.zeros(2 * n), np.full(2 * n, None, object), n)
    column = pd.Series(ArgsArray(LazyArgs(lambda: args), np.arange(n)))
    picked = column[column.index % 1000 == 7].iloc[::-1]
    assert not made
    assert picked.iloc[0] == {"a": 2 * 99_007, "b": 2 * 99_007 + 1}
    assert picked.tolist()[-1] == {"a": 14, "b": 15}
    assert sum(len(ids) for ids in made) == 1 + len(picked)
