"""A rank waiting for another at a collective polls with the CPU kept busy
(`busy_wait`) instead of blocking, blocks past the spin limit, and raises what the
collective raised. What is checked is whether the thread blocked, not its CPU time:
a yielding thread on a loaded machine gets little CPU, by design."""

from __future__ import annotations

import os
import threading
import time

import pytest
from neuron_explorer.backend.distributed import busy_wait

from tests.torch_distributed.ranks import run_ranks


class _Work:
    """A c10d Work that completes `after_s` from now, or fails then; it counts the polls
    and notes a blocking wait entered before it completed."""

    def __init__(self, after_s: float, error: Exception | None = None) -> None:
        self._done = threading.Event()
        self._error = error
        self.polls = 0
        self.blocked = False
        threading.Timer(after_s, self._done.set).start()

    def is_completed(self) -> bool:
        self.polls += 1
        return self._done.is_set()

    def wait(self) -> bool:
        self.blocked = self.blocked or not self._done.is_set()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True


def test_a_wait_polls_until_the_work_completes_without_blocking():
    work = _Work(0.1)
    busy_wait.wait(work)
    assert work._done.is_set() and not work.blocked
    assert work.polls > 1


def test_a_short_wait_naps_off_the_cpu(monkeypatch):
    """Its first millisecond (here, the whole wait) sleeps between polls: a spinning rank
    would take turns from the rank it waits for on a busy machine."""
    monkeypatch.setattr(busy_wait, "NAP_NS", 10_000_000_000)
    work = _Work(0.1)
    wall, cpu = time.monotonic(), time.thread_time()
    busy_wait.wait(work)
    share = (time.thread_time() - cpu) / (time.monotonic() - wall)
    assert not work.blocked and work.polls > 1
    assert share < 0.5, share  # spinning, the thread runs whenever no other wants the CPU


def test_past_the_spin_limit_a_wait_blocks(monkeypatch):
    monkeypatch.setattr(busy_wait, "SPIN_NS", 10_000_000)
    work = _Work(0.3)
    busy_wait.wait(work)
    assert work._done.is_set() and work.blocked


def test_a_failed_collective_raises_from_the_wait():
    with pytest.raises(RuntimeError, match="peer gone"):
        busy_wait.wait(_Work(0.01, RuntimeError("peer gone")))


def test_the_group_works_wait_busily_and_the_rest_is_gloos():
    made: list[_Work] = []

    class Group:
        size = 2

        def allreduce(self, tensors):
            made.append(_Work(0.05))
            return made[-1]

        def rank(self):
            return 0

    group = busy_wait.BusyWaits(Group())
    assert group.size == 2 and group.rank() == 0
    work = group.allreduce([])
    assert work.wait() is True and work.is_completed()
    assert not made[0].blocked and made[0].polls > 1


def test_with_more_ranks_than_cpus_the_waits_are_gloos_own():
    cpus = len(os.sched_getaffinity(0))
    assert busy_wait.spins(1) and busy_wait.spins(cpus) and not busy_wait.spins(cpus + 1)
    made: list[_Work] = []

    class Group:
        def allreduce(self, tensors):
            made.append(_Work(0.05))
            return made[-1]

    work = busy_wait.BusyWaits(Group(), spin=False).allreduce([])
    assert work is made[0]
    work.wait()
    assert made[0].blocked and made[0].polls == 0


@pytest.mark.slow  # starts two processes that import torch
@pytest.mark.skipif(not busy_wait.spins(2), reason="two ranks spin only with two CPUs")
def test_a_rank_waiting_for_a_late_peer_polls_instead_of_blocking(tmp_path):
    results = run_ranks("late_peer", 2, tmp_path)
    for rank, r in enumerate(results):
        assert r["returncode"] == 0, f"rank {rank} failed:\n{r['stderr']}"
        assert r["sum"] == [2 * (1 + 2)] * 4  # (1 + 2), summed twice
    # the early rank waited about 300 ms for the late one inside the all-reduce: it polled
    # gloo's work until it completed and never blocked on it
    early = results[0]
    assert early["waits"] and max(w["polls"] for w in early["waits"]) > 1
    assert not any(w["blocked"] for w in early["waits"])
