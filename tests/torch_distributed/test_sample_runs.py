"""The multi-rank sample runs in sample_traces/*.run show what their README says."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import neuron_explorer

RUNS = Path(__file__).resolve().parents[2] / "sample_traces"


def _collectives(run: str) -> list[list[dict]]:
    """Per rank (by the manifest), the collective slices' args plus their start and end."""
    manifest = json.loads((RUNS / f"{run}.run" / "manifest.json").read_text())
    assert len(manifest["ranks"]) == manifest["world_size"]
    per_rank = []
    for entry in manifest["ranks"]:
        path = RUNS / f"{run}.run" / entry["trace"]
        assert path.stat().st_size < 5 * 1024 * 1024, "sample traces stay under 5 MB"
        s = neuron_explorer.load(path).slices
        c = s[s.category == "collective"].sort_values("ts")
        per_rank.append([{**a, "ts": int(ts), "end": int(ts + d)}
                         for a, ts, d in zip(c["args"], c["ts"], c["dur"], strict=True)])
    return per_rank


def _in_step(per_rank: list[list[dict]]) -> None:
    """Every rank ran the same calls, and each ended at the same time on every rank."""
    for calls in zip(*per_rank, strict=True):
        assert len({(c["seq"], c["collective"], c["bytes"], c["group"]) for c in calls}) == 1
        assert len({c["end"] for c in calls}) == 1
        assert min(c["wait_ns"] for c in calls) == 0


def test_ddp_all_reduces_the_gradients_in_step():
    per_rank = _collectives("ddp")
    assert len(per_rank) == 4
    _in_step(per_rank)
    steps = collections.Counter(c["step"] for c in per_rank[0] if c["collective"] == "all_reduce")
    assert len(steps) == 3 and len(set(steps.values())) == 1  # the same buckets every step
    assert all(c["group"] == "[0, 1, 2, 3]" for c in per_rank[0])


def test_fsdp_gathers_and_scatters_once_per_module():
    per_rank = _collectives("fsdp")
    _in_step(per_rank)
    for step in (2, 3):
        ops = collections.Counter(c["collective"] for c in per_rank[0] if c["step"] == step)
        assert ops == {"all_gather_into_tensor": 5, "reduce_scatter_tensor": 3}


def test_straggler_the_fast_ranks_wait_for_the_slow_one():
    per_rank = _collectives("straggler")
    _in_step(per_rank)
    grads = [[c for c in calls if c["collective"] == "all_reduce"] for calls in per_rank]
    assert len(grads[0]) >= 4
    slow = grads[-1]
    assert all(c["wait_ns"] == 0 for c in slow)
    for fast in grads[:-1]:
        # about the 20 ms the slow rank adds per step (its other host time varies a little)
        assert all(c["wait_ns"] > 10_000_000 for c in fast), [c["wait_ns"] for c in fast]
