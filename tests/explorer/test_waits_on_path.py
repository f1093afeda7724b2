"""Device waits matched to the host syncs that paid them, by time (`waits_on_path`)."""

from __future__ import annotations

import json

import neuron_explorer
import pandas as pd
import pytest
from neuron_explorer.analyses import communication as comm
from neuron_explorer.analyses.waits_on_path import (
    delays_at_syncs,
    host_syncs,
    idle_after,
    slack_after,
)
from synthetic import TraceBuilder


def _coll(*rows: tuple[int, int, int, int]) -> pd.DataFrame:
    """(ts, dur, wait_ns, idle_after_ns) per call."""
    return pd.DataFrame(rows, columns=["ts", "dur", "wait_ns", "idle_after_ns"])


def _syncs(*rows: tuple[int, int]) -> pd.DataFrame:
    return pd.DataFrame([(ts, dur, 0) for ts, dur in rows], columns=["ts", "dur", "step"])


def test_a_sync_pays_a_wait_up_to_its_own_length():
    paid = delays_at_syncs(_coll((0, 1000, 400, 0)), _syncs((1000, 300), (2000, 300)))
    assert paid.tolist() == [300, 0]  # the second sync starts level: nothing left to pay


def test_device_idle_before_the_sync_absorbs_the_wait():
    assert delays_at_syncs(_coll((0, 1000, 400, 250)), _syncs((900, 300))).tolist() == [150]


def test_waits_add_up_until_a_sync_and_not_past_it():
    coll = _coll((0, 100, 100, 50), (200, 100, 100, 0), (750, 100, 70, 0))
    paid = delays_at_syncs(coll, _syncs((300, 400), (850, 20)))
    assert paid.tolist() == [150, 20]


def test_a_sync_that_ends_before_the_call_ends_pays_none_of_it():
    # the sync waits for work queued before the call: the call's wait comes after it
    assert delays_at_syncs(_coll((0, 1000, 500, 0)), _syncs((200, 600))).tolist() == [0]


def _trace(tmp_path):
    """Device: a kernel [0, 100k), an all-reduce [100k, 300k) that waits 150k, a kernel
    [400k, 500k). Host: a sync [350k, 500k) waiting for that kernel."""
    b = TraceBuilder()
    host = b.thread()
    kernels = b.device_track(0, "Kernels")
    queue = b.device_track(0, "Collectives")
    b.metadata(host, {"hardware": "trn2"})
    b.slice(kernels, 0, 100_000, "k0", "kernel", {"kernel_id": 1, "device": 0})
    b.slice(queue, 100_000, 200_000, "all_reduce", "collective",
            {"collective": "all_reduce", "bytes": 1 << 20, "group": json.dumps([0, 1]),
             "seq": 0, "wait_ns": 150_000, "transfer_ns": 50_000, "device": 0})
    b.slice(kernels, 400_000, 100_000, "k1", "kernel", {"kernel_id": 2, "device": 0})
    b.slice(host, 350_000, 150_000, "sync (item)", "sync", {"kind": "item"})
    return neuron_explorer.load(b.write_pftrace(tmp_path / "t.pftrace"))


def test_a_traces_syncs_and_the_idle_after_its_calls(tmp_path):
    trace = _trace(tmp_path)
    syncs = host_syncs(trace)
    assert syncs[["ts", "dur"]].values.tolist() == [[350_000, 150_000]]
    coll = comm.collectives(trace)
    # idle from the call's end (300k) until the next kernel (400k), before the sync ends
    assert idle_after(trace, coll, syncs).tolist() == [100_000]
    coll = coll.assign(idle_after_ns=idle_after(trace, coll, syncs))
    # 150k of wait, 100k of it absorbed by the idle device: the sync pays 50k
    assert delays_at_syncs(coll, syncs).tolist() == [50_000]


def test_the_jitter_floor_uses_the_expected_maximum_of_normals():
    """Ranks that wait for the slowest of n equally noisy peers wait E[max of n] spreads:
    1/sqrt(pi) for two, 1.0294 for four (tables of normal order statistics)."""
    import math

    from neuron_explorer.analyses.ranks import _expected_max_normal

    assert _expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    assert _expected_max_normal(4) == pytest.approx(1.0294, abs=1e-4)
    assert _expected_max_normal(1) == pytest.approx(0.0, abs=1e-9)


def test_a_kernel_launched_late_carries_on_only_its_slack():
    """A host-bound rank's optimizer kernels, launched behind a late all-reduce, would
    have waited for their launches had it ended on time: a compiled DDP rank was counted
    248 us of a wait on its path where balancing the ranks saved 43 (the least slack of
    the kernels between the call and the sync, 45 us)."""
    coll = _coll((0, 1000, 400, 0)).assign(slack_after_ns=[45])
    assert delays_at_syncs(coll, _syncs((1000, 300))).tolist() == [45]
    coll = _coll((0, 1000, 400, 0)).assign(slack_after_ns=[1000])  # launched long before
    assert delays_at_syncs(coll, _syncs((1000, 300))).tolist() == [300]


def test_the_slack_after_a_call_is_its_next_kernels_start_less_their_launch(tmp_path):
    """The kernel after the all-reduce (start 400k) is launched by an op that ends at
    380k: had the device been free 150k earlier, it would have waited for that launch,
    passing on 20k of the delay."""
    b = TraceBuilder()
    host = b.thread()
    kernels = b.device_track(0, "Kernels")
    queue = b.device_track(0, "Collectives")
    b.metadata(host, {"hardware": "trn2"})
    b.slice(host, 0, 1_000, "aten::add", "op", {"op_id": 1})
    b.slice(kernels, 1_000, 99_000, "k0", "kernel", {"kernel_id": 1, "device": 0,
                                                     "op_id": 1})
    b.slice(queue, 100_000, 200_000, "all_reduce", "collective",
            {"collective": "all_reduce", "bytes": 1 << 20, "group": json.dumps([0, 1]),
             "seq": 0, "wait_ns": 150_000, "transfer_ns": 50_000, "device": 0})
    b.slice(host, 370_000, 10_000, "aten::mul", "op", {"op_id": 2})
    b.slice(kernels, 400_000, 100_000, "k1", "kernel", {"kernel_id": 2, "device": 0,
                                                        "op_id": 2})
    b.slice(host, 390_000, 150_000, "sync (item)", "sync", {"kind": "item"})
    trace = neuron_explorer.load(b.write_pftrace(tmp_path / "t.pftrace"))
    syncs = host_syncs(trace)
    coll = comm.collectives(trace)
    assert slack_after(trace, coll, syncs).tolist() == [20_000]
    coll = coll.assign(idle_after_ns=idle_after(trace, coll, syncs),
                       slack_after_ns=slack_after(trace, coll, syncs))
    assert delays_at_syncs(coll, syncs).tolist() == [20_000]
