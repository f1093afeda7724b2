"""A .pftrace's first load with the trace cache on is decoded a window of the file at a
time into its store (`loaders/pftrace_stream.py`, `store/streamed.py`). It must give what
the trace read whole gives: the same slices (ids, nesting, categoricals), args, tracks,
counters, flows, metadata, what was skipped and the warnings, on recordings of each kind,
and on files cut short or damaged. Tiny windows and chunks make every carry across
windows and chunks happen: slices open across them, and begins written after their
children (as the recorder writes them), which run back in time in the file."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import neuron_explorer
import neuron_explorer.loaders
import neuron_explorer.trace as trace_module
import numpy as np
import pandas as pd
import pytest
from heard import warnings_heard
from neuron_explorer.common.errors import TraceFormatError
from neuron_explorer.loaders import pftrace_stream

ROOT = Path(__file__).parents[2]
SAMPLES = ["gpt_compiled.pftrace", "nki_kernels.pftrace", "serve.pftrace", "odd_dims.pftrace"]


def _variants(tmp_path: Path) -> list[Path]:
    """Sample recordings, and one cut short and a few damaged."""
    paths = [ROOT / "sample_traces" / name for name in SAMPLES]
    paths += sorted((ROOT / "tests" / "data" / "fuzz_corpus").glob("*.pftrace"))
    data = (ROOT / "sample_traces" / "odd_dims.pftrace").read_bytes()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[: len(data) // 2])
    paths.append(cut)
    rng = random.Random(7)
    for i in range(4):
        damaged = bytearray(data)
        at = rng.randrange(64, len(damaged) - 8)
        damaged[at:at + 3] = bytes(rng.randrange(256) for _ in range(3))
        paths.append(tmp_path / f"damaged_{i}.pftrace")
        paths[-1].write_bytes(bytes(damaged))
    return paths


@pytest.fixture(autouse=True)
def every_size_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of every size decoded in windows (by default only large ones are)."""
    monkeypatch.setattr(neuron_explorer.loaders, "STREAM_MIN_BYTES", 0)


def _load(path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, whole: bool) -> Any:
    """(trace or the error's text, the warnings' texts) of a first load into `cache`."""
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(cache))
    with monkeypatch.context() as m:
        if whole:
            m.setattr(trace_module, "decoded_in_windows", lambda *a, **k: False)
        with warnings_heard() as caught:
            try:
                trace = neuron_explorer.load(path)
            except TraceFormatError as exc:
                return str(exc), []
    assert trace.store_folder is not None
    return trace, [str(w.message) for w in caught]


def _by_slice(args: pd.DataFrame) -> pd.DataFrame:
    key = args["key"].astype(str)
    return args.assign(key_text=key).sort_values(["slice_id", "key_text"], kind="stable",
                                                  ignore_index=True).drop(columns="key_text")


def _assert_same(whole: Any, streamed: Any, warnings_in_order: bool = True) -> None:
    for name in ("_slices", "tracks", "counters", "flows"):
        pd.testing.assert_frame_equal(getattr(whole, name), getattr(streamed, name), obj=name)
    ids = np.arange(len(whole._slices))
    assert whole.slice_args.dicts_of(ids) == streamed.slice_args.dicts_of(ids)
    # the long args table, by slice and key (its row order follows the files' row groups)
    pd.testing.assert_frame_equal(_by_slice(whole.table("args")),
                                  _by_slice(streamed.table("args")))
    assert whole.metadata == streamed.metadata
    assert whole.skipped == streamed.skipped
    if warnings_in_order:
        assert whole.warnings == streamed.warnings
    else:  # a cached reload repeats them in the order they were heard
        assert sorted(whole.warnings) == sorted(streamed.warnings)


@pytest.mark.slow
@pytest.mark.parametrize("tiny", [False, True], ids=["windows", "tiny_windows"])
def test_a_streamed_first_load_gives_what_the_whole_read_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: bool) -> None:
    loaded = 0
    for i, path in enumerate(_variants(tmp_path)):
        if tiny:  # the large recordings in windows of a few packets, the others of one
            small = path.stat().st_size < 100_000
            monkeypatch.setattr(pftrace_stream, "WINDOW_BYTES", 512 if small else 32_768)
            monkeypatch.setattr(pftrace_stream, "EDGES_PER_CHUNK", 7 if small else 1000)
            monkeypatch.setattr(pftrace_stream, "ANNOTATIONS_PER_CHUNK", 5 if small else 500)
        whole, heard_whole = _load(path, tmp_path / f"whole{i}", monkeypatch, whole=True)
        streamed, heard = _load(path, tmp_path / f"streamed{i}", monkeypatch, whole=False)
        assert heard == heard_whole, path
        if isinstance(whole, str):  # a file neither reads: the same error
            assert streamed == whole, path
            continue
        _assert_same(whole, streamed)
        # and the entry it wrote reads back as the same trace
        monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(tmp_path / f"streamed{i}"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _assert_same(whole, neuron_explorer.load(path), warnings_in_order=False)
        loaded += 1
    assert loaded >= len(SAMPLES) + 3  # the samples, the fuzz corpus's and the cut file


def test_a_streamed_load_leaves_no_spill_behind(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pftrace_stream, "WINDOW_BYTES", 4096)
    trace, _ = _load(ROOT / "sample_traces" / "serve.pftrace", tmp_path / "c", monkeypatch,
                     whole=False)
    entry = Path(trace.store_folder)
    assert sorted(p.name for p in entry.iterdir()) == sorted(
        ["trace.json", "slices.parquet", "tracks.parquet", "counters.parquet",
         "flows.parquet", "args.parquet"])
    assert [p.name for p in (tmp_path / "c").iterdir()] == [entry.name]
