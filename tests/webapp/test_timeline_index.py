"""The timeline index answers window queries with only what is visible, merged per pixel."""

from __future__ import annotations

import numpy as np
import pandas as pd
from neuron_explorer.plot.timeline import build_index
from neuron_explorer.plot.timeline_index import SUMMARY_ID, TimelineIndex
from synthetic_trace import load_synthetic


def _slices(rows):
    df = pd.DataFrame(rows, columns=["id", "ts", "dur", "name", "category", "track_id", "depth"])
    df["parent_id"] = -1
    df["args"] = None
    return df


TRACKS = pd.DataFrame({"track_id": [1, 2], "name": ["main", "Kernels"],
                       "kind": ["thread", "kernels"], "process": ["host", "neuron:0 (trn2)"],
                       "pid": [1, 2], "tid": [1, 2], "device": [-1, 0]})


def test_rows_follow_tracks_and_depths_host_first():
    df = _slices([(1, 0, 100, "k", "kernel", 2, 0), (2, 0, 100, "step", "step", 1, 0),
                  (3, 10, 50, "op", "op", 1, 1)])
    index = TimelineIndex(df, TRACKS, pd.DataFrame())
    # the name on its first row; nested rows say what they hold
    assert index.labels == ["main", "↳ op", "Kernels"]
    assert index.slice_rows[1].label == "main" and index.slice_rows[1].depth == 1
    assert index.row_of(3) == 1 and index.row_of(1) == 2 and index.row_of(99) is None
    assert (index.start_ns, index.end_ns) == (0, 100)


def test_the_metadata_instant_does_not_stretch_the_whole_trace_view():
    # recorded with --steps 2:4: the metadata instant marks the recording's start, seconds
    # before the first recorded step
    df = _slices([(1, 0, 0, "neuron_explorer.metadata", "metadata", 1, 0),
                  (2, 4_000_000, 100, "step 2", "step", 1, 0)])
    index = TimelineIndex(df, TRACKS, pd.DataFrame())
    assert (index.start_ns, index.end_ns) == (4_000_000, 4_000_100)
    assert df.iloc[index.table_position(2)]["id"] == 2  # positions still index the whole table


def test_zoomed_window_returns_exact_slices_only():
    df = _slices([(i, i * 1000, 500, f"s{i}", "op", 1, 0) for i in range(100)])
    index = TimelineIndex(df, TRACKS, pd.DataFrame())
    w = index.query(10_000, 12_600, width_px=1000)
    assert sorted(w.ids.tolist()) == [10, 11, 12]  # 9 ends at 9500 (< window), 13 starts after
    assert (w.count == 1).all()
    assert w.names == ["s10", "s11", "s12"]


def test_a_long_slice_before_the_window_is_still_found():
    # ends are not sorted within a row when a long slice is followed by short ones
    df = _slices([(1, 0, 1_000_000, "long", "op", 1, 0), (2, 10, 5, "a", "op", 1, 0)])
    index = TimelineIndex(df, TRACKS, pd.DataFrame())
    w = index.query(500_000, 600_000, width_px=100)
    assert w.ids.tolist() == [1]


def test_small_slices_merge_into_at_most_one_bar_per_pixel():
    n = 200_000
    ts = np.arange(n) * 100
    df = pd.DataFrame({"id": np.arange(n), "ts": ts, "dur": 50, "name": "tiny", "category": "op",
                       "track_id": 1, "depth": 0, "parent_id": -1, "args": None})
    index = TimelineIndex(df, TRACKS, pd.DataFrame())
    w = index.query(0, int(ts[-1]) + 50, width_px=800)
    assert w.n_bars <= 800
    assert int(w.count.sum()) == n  # nothing visible is dropped: every slice is in some bar
    assert (w.ids == SUMMARY_ID).all()


def test_every_visible_slice_is_covered_by_a_bar_of_its_row(tmp_path):
    trace = load_synthetic(tmp_path, n_steps=2, ops_per_step=300)
    index = build_index(trace)
    t0 = index.start_ns + (index.end_ns - index.start_ns) // 3
    t1 = t0 + (index.end_ns - index.start_ns) // 5
    w = index.query(t0, t1, width_px=300)
    s = trace.table("slices")
    s = s[s["category"] != "metadata"]
    visible = s[(s["ts"] < t1) & (s["ts"] + s["dur"] >= t0)]
    assert int(w.count.sum()) == len(visible)
    for row in visible.sample(50, random_state=1).itertuples():
        r = index.row_of(row.id)
        in_row = w.row == r
        covered = (w.start[in_row] <= row.ts) & (w.end[in_row] >= row.ts + row.dur)
        assert covered.any(), row


def test_counters_are_reduced_to_one_point_per_bucket():
    counters = pd.DataFrame({"ts": np.arange(100_000) * 10, "value": np.arange(100_000) % 7,
                             "track_id": 9, "name": "HBM in use (bytes)"})
    index = TimelineIndex(pd.DataFrame(), TRACKS, counters)
    w = index.query(0, 1_000_000, width_px=500)
    (row, ts, values), = w.counters
    assert row == 0 and ts.size <= 501
    assert values.max() == 6  # the max of each bucket survives


def test_table_position_points_into_the_slices_table(tmp_path):
    trace = load_synthetic(tmp_path, n_steps=1, ops_per_step=8)
    index = build_index(trace)
    some_id = int(trace.ops["id"].iloc[3])
    assert trace.table("slices").iloc[index.table_position(some_id)]["id"] == some_id
    assert index.table_position(-5) is None


def test_dma_queues_fold_into_one_row_per_device_unless_asked():
    tracks = pd.DataFrame({"track_id": [1, 5, 6, 7],
                           "name": ["main", "DMA q0", "DMA q1", "DMA q10"],
                           "kind": ["thread", "dma", "dma", "dma"],
                           "process": ["host"] + ["neuron:0 (trn2)"] * 3,
                           "pid": [1, 2, 2, 2], "tid": [1, 5, 6, 7], "device": [-1, 0, 0, 0]})
    df = _slices([(1, 0, 100, "op", "op", 1, 0), (2, 0, 50, "d", "dma", 5, 0),
                  (3, 10, 50, "d", "dma", 6, 0), (4, 20, 50, "d", "dma", 7, 0)])
    folded = TimelineIndex(df, tracks, pd.DataFrame())
    assert folded.labels == ["main", "DMA (3 queues)"]
    assert folded.row_of(4) == 1 and folded.query(0, 100, 1000).n_bars == 4
    every = TimelineIndex(df, tracks, pd.DataFrame(), fold_dma=False)
    assert every.labels == ["main", "DMA q0", "DMA q1", "DMA q10"]


def test_search_finds_names_in_any_case_in_time_order_across_rows():
    df = _slices([(1, 50, 10, "aten::MatMul", "op", 1, 1), (2, 0, 100, "step 0", "step", 1, 0),
                  (3, 5, 10, "matmul_kernel", "kernel", 2, 0), (4, 20, 10, "relu", "op", 1, 1),
                  (5, 30, 10, None, "op", 1, 1)])
    df["name"] = df["name"].astype("category")  # as loaded: categorical, one name missing
    index = TimelineIndex(df, TRACKS, pd.DataFrame())
    assert index.search("MATMUL").tolist() == [3, 1]
    assert index.search("relu").tolist() == [4] and index.search("nothing").size == 0
    w = index.query(0, 100, width_px=1000)
    assert dict(zip(w.ids.tolist(), w.names, strict=True))[5] is None


def test_a_nested_row_names_its_two_commonest_categories():
    rows = [(i, i * 10, 5, f"s{i}", "op" if i % 3 else "module", 1, 1) for i in range(1, 10)]
    index = TimelineIndex(_slices(rows + [(99, 0, 100, "step", "step", 1, 0)]), TRACKS,
                          pd.DataFrame())
    assert index.labels == ["main", "↳ op · module"]
