"""Runs that cannot support a verdict across ranks: ranks missing from the world, and
calls paired by their order that are not the same call."""

from __future__ import annotations

import json
import shutil

import neuron_explorer
import run_scenarios as rs
from neuron_explorer.cli import main

SAMPLED = ("trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz")


def test_two_ranks_of_a_128_rank_job_say_so_and_blame_no_rank(tmp_path, real_traces_dir,
                                                                 capsys):
    """HTA's sampled traces: ranks 0 and 1 of a world of 128. The ranks' collectives wait
    for ranks that are not here: no straggler, wait or imbalance finding, waits unknown."""
    folder = tmp_path / "sampled"
    folder.mkdir()
    for name in SAMPLED:
        shutil.copy(real_traces_dir / name, folder / name)
    run = neuron_explorer.load(folder)
    summary = run.summary()
    assert (summary["world_size"], summary["complete"]) == (128, False)
    assert summary["missing_ranks"] == list(range(2, 128))
    assert not len(run.stragglers())
    found = {f.rule_id for f in run.bottlenecks()}
    assert not found & {"straggler_rank", "collective_wait", "load_imbalance"}
    assert (run.collectives["wait_ns"] == 0).all()  # not derived against absent ranks
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "2 of 128 (126 not in this run" in out
    assert "is a straggler" not in out


def test_calls_paired_by_order_but_of_other_sizes_are_not_one_call(tmp_path):
    """Rank 1's n-th all-reduce moves 64x the bytes of rank 0's: numbered by call order
    (no sequence number in the trace), they are not the same call and neither waits."""
    folder = tmp_path / "gpus"
    folder.mkdir()
    for rank, start in ((0, 500.0), (1, 700.0)):
        trace = rs.kineto_rank(rank, 2, start)
        if rank == 1:
            for event in trace["traceEvents"]:
                if event["name"] == "nccl:all_reduce":
                    event["args"]["Input Dims"] = [[64 * 1048576]]
        (folder / f"rank{rank}.json").write_text(json.dumps(trace))
    run = neuron_explorer.load(folder)
    coll = run.collectives.set_index("rank")
    assert list(coll["ranks_arrived"]) == [1, 1]
    assert list(coll["wait_ns"]) == [0, 0]
    assert not len(run.stragglers())
