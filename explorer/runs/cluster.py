"""Per-rank work as tasks on a Dask distributed cluster.

`scheduler="local"` starts a `LocalCluster` on this machine for the call; any other
value is a running scheduler's address (`tcp://host:8786`), as `dask scheduler`,
dask-jobqueue (SLURM, PBS) or dask-kubernetes start one. Dask is imported only here,
so a load without a scheduler never imports it. Each task returns a small result
(a rank's digest, a file's path): the client never holds every rank's slices.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from neuron_explorer.common.errors import NeuronExplorerError

T = TypeVar("T")
LOCAL = "local"


@contextmanager
def client_for(scheduler: str, workers: int | None = None) -> Iterator[Any]:
    """A Dask client of the scheduler (a LocalCluster of `workers` processes for
    `local`), closed on exit."""
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - a dependency; a broken install
        raise NeuronExplorerError("running on a cluster needs dask.distributed: "
                                  "pip install 'dask[distributed]'") from None
    # on a busy machine spawned workers may take long to start and answer: wait for them
    # rather than giving up after Dask's 30 s
    patience = {"distributed.comm.timeouts.connect": "300s",
                "distributed.comm.timeouts.tcp": "300s"} if scheduler == LOCAL else {}
    with dask.config.set(patience):
        cluster = None
        try:
            if scheduler == LOCAL:
                cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1,
                                       threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=logging.ERROR)
                client = Client(cluster)
            else:
                client = Client(scheduler, timeout=30)
        except (OSError, TimeoutError, ValueError, RuntimeError) as exc:
            if cluster is not None:
                cluster.close()
            where = "start a local Dask cluster" if scheduler == LOCAL else \
                f"reach the Dask scheduler {scheduler}"
            raise NeuronExplorerError(
                f"cannot {where} ({exc}); check the address (tcp://HOST:8786) and that "
                "`dask scheduler` runs there, or load without a scheduler") from None
        try:
            yield client
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


def dask_map(function: Callable[[str], T], items: Sequence[str], scheduler: str,
             workers: int | None, done: Callable[[], None]) -> list[T]:
    """`function(item)` for every item as tasks on the cluster, in item order; `done()`
    after each finishes (the progress bar). A task's error is raised here as it was."""
    from distributed import as_completed

    with client_for(scheduler, workers) as client:
        futures = client.map(function, list(items), pure=False)
        for _ in as_completed(futures):
            done()
        return client.gather(futures)
