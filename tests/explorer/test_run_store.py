"""Runs over the store: each rank kept as Parquet, SQL over every rank's files, a converted
run, and the same results on a Dask LocalCluster as in one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import neuron_explorer
import pandas as pd
import pytest
import run_scenarios as rs
from neuron_explorer.cli import main as cli_main

WORLD = 16


def sixteen_ranks(folder: Path) -> Path:
    """16 ranks; rank 15 computes longer and arrives late, so the others wait for it."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(WORLD):
        late = rank == WORLD - 1
        rs.write_rank(folder, rank, WORLD, compute=700_000 if late else 600_000,
                      coll_start=500_000 if late else 400_000, wait=0 if late else 100_000)
    (folder / "manifest.json").write_text(json.dumps({"world_size": WORLD}))
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sixteen_ranks(tmp_path_factory.mktemp("store_runs") / "train.run")


@pytest.fixture(scope="module")
def plain(run_dir: Path) -> tuple[neuron_explorer.Run, dict]:
    """The run loaded without the cache, in local processes, and its results."""
    run = neuron_explorer.load(run_dir, cache=False, processes=2)
    return run, results(run)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(folder))
    return folder


def results(run: neuron_explorer.Run) -> dict:
    return {"summary": run.rank_summary().drop(columns="path"),
            "step_times": run.step_times(), "stragglers": run.stragglers(),
            "communication": run.communication(), "collectives": run.collectives,
            "findings": [f.to_dict() for f in run.bottlenecks()]}


def assert_same_results(a: dict, b: dict) -> None:
    for key, value in a.items():
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(value, b[key], obj=key)
        else:
            assert value == b[key], key


@pytest.mark.slow  # 10.8 s in a fresh-clone CI run: sixteen ranks loaded (the first test)
def test_run_sql_reads_every_ranks_parquet(run_dir: Path, cache_dir: Path, plain,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    plain, expected = plain
    stored = neuron_explorer.load(run_dir, processes=2)
    assert all(d.store for d in stored.digests.values())
    assert_same_results(expected, results(stored))

    def refuse(_trace):
        raise AssertionError("a kept digest was computed again")

    with monkeypatch.context() as m:  # a reload reads each rank's kept digest
        m.setattr("neuron_explorer.runs.digest.digest_trace", refuse)
        assert_same_results(expected, results(neuron_explorer.load(run_dir, processes=1)))
    counts = stored.sql("SELECT rank, count(*) AS n FROM slices GROUP BY rank ORDER BY rank")
    assert counts["rank"].tolist() == list(range(WORLD))
    assert counts["n"].tolist() == [len(plain[r].table("slices")) for r in range(WORLD)]
    query = "SELECT rank, sum(dur) AS d FROM kernels GROUP BY rank ORDER BY rank"
    pd.testing.assert_frame_equal(stored.sql(query), plain.sql(query))
    # a table the digests did not write is written by the workers first
    assert stored.sql("SELECT count(DISTINCT rank) AS n FROM modules")["n"].tolist() in ([0],
                                                                                         [WORLD])


def test_a_converted_run_loads_alone(run_dir: Path, tmp_path: Path, cache_dir: Path,
                                     plain) -> None:
    out = tmp_path / "converted"
    assert cli_main(["convert", str(run_dir), "-o", str(out), "--quiet"]) == 0
    run = neuron_explorer.load(out)
    assert isinstance(run, neuron_explorer.Run) and run.ranks == list(range(WORLD))
    assert not cache_dir.exists()  # converting and reading it back use no cache
    assert_same_results(plain[1], results(run))
    assert len(run[3].table("slices")) > 0


def test_nothing_of_dask_is_imported_without_a_scheduler(run_dir: Path) -> None:
    code = ("import sys, neuron_explorer as ne; r = ne.load(sys.argv[1], processes=2); "
            "r.bottlenecks(); r.sql('select count(*) from steps'); "
            "print(any(m == 'dask' or m.startswith(('dask.', 'distributed')) "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_a_local_dask_cluster_gives_the_same_results(run_dir: Path, cache_dir: Path,
                                                     plain) -> None:
    on_dask = neuron_explorer.load(run_dir, scheduler="local", processes=2)
    assert on_dask.scheduler == "local"
    assert_same_results(plain[1], results(on_dask))
    query = "SELECT rank, count(*) AS n FROM instructions GROUP BY rank ORDER BY rank"
    pd.testing.assert_frame_equal(on_dask.sql(query), plain[0].sql(query))
