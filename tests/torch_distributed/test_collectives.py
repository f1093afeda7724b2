"""The neuron backend's collectives on real processes: numbers, async ops, the coupling
rule, a dead rank."""

from __future__ import annotations

import time

import pytest

from tests.torch_distributed.ranks import run_ranks

pytestmark = pytest.mark.slow  # each test starts 2-3 processes that import torch


def _ok(results: list[dict]) -> list[dict]:
    for rank, r in enumerate(results):
        assert r["returncode"] == 0, f"rank {rank} failed:\n{r['stderr']}"
    return results


def test_every_collective_gives_the_numbers(tmp_path):
    world = 3
    results = _ok(run_ranks("collectives", world, tmp_path))
    base = [sum(i + r + 1 for r in range(world)) for i in range(4)]
    for rank, r in enumerate(results):
        assert r["all_reduce_SUM"] == base
        assert r["all_reduce_AVG"] == pytest.approx([b / world for b in base])
        assert r["all_reduce_MAX"] == [i + world for i in range(4)]
        assert r["all_reduce_MIN"] == [i + 1.0 for i in range(4)]
        prod = [1.0] * 4
        for k in range(world):
            prod = [p * (i + k + 1) for i, p in enumerate(prod)]
        assert r["all_reduce_PRODUCT"] == prod
        assert r["all_reduce_int64"] == [i * sum(range(1, world + 1)) for i in range(3)]
        assert r["broadcast"] == [world - 1.0] * 3
        assert r["all_gather"] == [[float(k)] * 2 for k in range(world)]
        assert r["all_gather_into_tensor"] == [float(k) for k in range(world) for _ in range(2)]
        total = sum(range(1, world + 1))
        assert r["reduce_scatter_tensor"] == [float((2 * rank + j) * total) for j in range(2)]
        assert r["reduce_scatter"] == [float(total * (rank + 1))] * 2
        assert r["all_to_all_single"] == [float(rank + 10 * k) for k in range(world)]
        assert r["all_reduce_strided"] == [float(total)] * 4
        assert r["async_type"] == "NeuronWork" and r["async_wait"] is True
        assert r["async_future"] == [[float(world)] * 2]
        assert "float8_e4m3fn is not supported" in r["error_complex_avg"]
        assert r["scatter"] == [10.0 * rank] * 2
        assert r["error_all_to_all"].startswith("CollectiveError: all_to_all is not supported")
        assert "PREMUL_SUM" in r["error_premul"] or "not supported" in r["error_premul"]
    assert results[1]["recv"] == [7.0, 8.0]
    assert results[0]["gather"] == [[k + 0.5] for k in range(world)]
    assert results[0]["reduce"] == [float(sum(range(1, world + 1)))] * 2


def test_collectives_couple_the_ranks(tmp_path):
    results = _ok(run_ranks("coupling", 2, tmp_path))
    runs = [next(x for x in r["runs"] if x["collective"] == "all_reduce") for r in results]
    assert runs[0]["seq"] == runs[1]["seq"]
    # a collective reaches the device once the work queued before it there has finished
    for r, run in zip(results, runs, strict=True):
        assert run["arrival"] >= r["ready_before"]
    # which rank comes last depends on how the OS ran the two processes, not on the test
    early, late = sorted(runs, key=lambda x: x["arrival"])
    # finish = max(arrivals) + cost on every rank; only the early one waits
    assert late["start"] == early["start"] == late["arrival"]
    assert late["end"] == early["end"] == late["start"] + late["transfer"]
    assert late["wait"] == 0 and early["wait"] == late["arrival"] - early["arrival"]
    # waiting on an async collective makes the compute queue wait for its end
    for r in results:
        big = next(x for x in r["runs"] if x["bytes"] == 4 << 18)
        assert r["before_wait"] < big["end"] <= r["after_wait"]


def test_default_backend_and_dtensor(tmp_path):
    world = 2
    results = _ok(run_ranks("default_backend", world, tmp_path))
    for rank, r in enumerate(results):
        assert r["current_device"] == rank  # LOCAL_RANK's core
        assert r["cpu_all_reduce"] == [3.0, 3.0]
        assert r["local_shard"] == [[8.0 * rank + 4 * i + j for j in range(4)] for i in range(2)]
        assert r["gathered_equal"] is True
        assert r["replicate"] == [1.0] * 3
        assert r["partial_to_replicate"] == [3.0] * 3


def test_a_dead_rank_fails_the_others_naming_it(tmp_path):
    start = time.monotonic()
    results = run_ranks("dead_rank", 3, tmp_path, timeout=60)
    assert time.monotonic() - start < 60
    assert results[2]["returncode"] == -9
    for r in results[:2]:
        assert r["returncode"] == 0, r["stderr"]
        assert r["error"].startswith("CollectiveError: all_reduce (call 2 of group [0, 1, 2])")
        assert "rank 2 exited" in r["error"]
