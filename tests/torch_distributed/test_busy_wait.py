"""A rank waiting for another at a collective keeps its CPU busy (`busy_wait`), and still
waits, blocks past the spin limit, and raises what the collective raised."""

from __future__ import annotations

import threading
import time

import pytest
from neuron_explorer.backend.distributed import busy_wait

from tests.torch_distributed.ranks import run_ranks


class _Work:
    """A c10d Work that completes `after_s` from now, or fails then."""

    def __init__(self, after_s: float, error: Exception | None = None) -> None:
        self._done = threading.Event()
        self._error = error
        threading.Timer(after_s, self._done.set).start()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True


def _cpu_share_of_wait(work: _Work) -> float:
    wall, cpu = time.monotonic(), time.thread_time()
    busy_wait.wait(work)
    return (time.thread_time() - cpu) / (time.monotonic() - wall)


def test_a_wait_spins_until_the_work_completes():
    work = _Work(0.1)
    share = _cpu_share_of_wait(work)
    assert work.is_completed()
    # blocked, the thread would use about none of it; yielding to other runnable threads
    # on a loaded machine, it still runs for a good part
    assert share > 0.25, share


def test_past_the_spin_limit_a_wait_blocks(monkeypatch):
    monkeypatch.setattr(busy_wait, "SPIN_NS", 10_000_000)
    work = _Work(0.3)
    share = _cpu_share_of_wait(work)
    assert work.is_completed()
    assert share < 0.2, share


def test_a_failed_collective_raises_from_the_wait():
    with pytest.raises(RuntimeError, match="peer gone"):
        busy_wait.wait(_Work(0.01, RuntimeError("peer gone")))


def test_the_group_works_wait_busily_and_the_rest_is_gloos():
    class Group:
        size = 2

        def allreduce(self, tensors):
            return _Work(0.05)

        def rank(self):
            return 0

    group = busy_wait.BusyWaits(Group())
    assert group.size == 2 and group.rank() == 0
    work = group.allreduce([])
    assert work.wait() is True and work.is_completed()


@pytest.mark.slow  # starts two processes that import torch
def test_a_rank_waiting_for_a_late_peer_keeps_its_cpu_busy(tmp_path):
    results = run_ranks("late_peer", 2, tmp_path)
    for rank, r in enumerate(results):
        assert r["returncode"] == 0, f"rank {rank} failed:\n{r['stderr']}"
        assert r["sum"] == [2 * (1 + 2)] * 4  # (1 + 2), summed twice
    # the early rank waited about 150 ms, spinning: blocked, it would use about none of it
    assert results[0]["cpu_share"] > 0.25, results[0]["cpu_share"]
