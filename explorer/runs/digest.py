"""What a run keeps of each rank: the small tables cross-rank analyses need.

A multi-rank run can be far larger than memory, so a `Run` never holds every
rank's slices: each rank is loaded (in a worker process when there are several),
reduced to its digest (steps, collectives, communication, summary, findings), and
let go. A rank's full `Trace` is loaded again only when asked for (`run[rank]`).
Where the rank is kept in the trace cache, the digest names its store folder, whose
Parquet files `run.sql` reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses import communication as comm
from neuron_explorer.analyses.levels import modelled_host_clock
from neuron_explorer.rules.finding import Finding
from neuron_explorer.runs.files import distributed_info

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


@dataclass
class RankDigest:
    """One rank of a run, reduced to what the run's analyses read."""

    path: str
    source_format: str
    hardware: str | None
    own_rank: int | None  # the rank the trace itself states, if any
    world_size: int | None
    summary: dict[str, Any]
    steps: pd.DataFrame
    collectives: pd.DataFrame
    communication: pd.DataFrame
    kernel_types: pd.DataFrame
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    store: str | None = None  # the rank's store folder (trace cache), if kept in one
    # the host's waits on the device (`waits_on_path.host_syncs`)
    syncs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["ts", "dur",
                                                                              "step"]))
    # what the analysed steps save with the small collectives issued as one host call a
    # step of each kind (`what_if.merged_collectives`; None: none to merge, or no replay)
    merged_collectives_ns: float | None = None
    # the host's times are the ops' modelled costs (`NEURON_HOST_CLOCK=modelled`)
    modelled_host_clock: bool = False

    def store_file(self, table: str) -> str | None:
        """The Parquet file of one of the rank's tables, if its store holds it."""
        if self.store is None:
            return None
        file = os.path.join(self.store, f"{table}.parquet")
        return file if os.path.isfile(file) else None


def digest_file(path: str, cache: bool | None = None) -> RankDigest:
    """Load one rank's trace and reduce it to its digest (runs in a worker process). A
    rank kept in the trace cache keeps its digest there too: a reload reads it."""
    import warnings

    from neuron_explorer.trace import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = cast("Trace", load(path, cache=cache))  # one file: a Trace
        folder = trace.store_folder
        kept = _read_kept(folder) if folder else None
        if kept is not None:
            kept.path = trace.path or kept.path
            return kept
        digest = digest_trace(trace)
    if folder:
        _keep(folder, digest)
    return digest


# The digest of a cached rank, pickled beside its tables: written and read only by this
# package in the user's own cache (a converted folder from elsewhere is never unpickled),
# and only for the same store build and package version.
DIGEST_FILE = "digest.pickle"
# raised whenever a digest's tables or findings change (16: collectives in the step that
# launched them; 17: whether the host clock is modelled)
DIGEST_SCHEMA = 17


def _digest_key(folder: str) -> str | None:
    from neuron_explorer import __version__
    from neuron_explorer.store.parquet import StoreError, read_manifest

    try:
        return f"{read_manifest(folder).get('build')}:{__version__}:{DIGEST_SCHEMA}"
    except StoreError:
        return None


def _read_kept(folder: str) -> RankDigest | None:
    import pickle

    key = _digest_key(folder)
    try:
        with open(os.path.join(folder, DIGEST_FILE), "rb") as f:
            stored_key, digest = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
            ValueError, TypeError):
        return None
    return digest if key is not None and stored_key == key and \
        isinstance(digest, RankDigest) else None


def _keep(folder: str, digest: RankDigest) -> None:
    import pickle

    key = _digest_key(folder)
    if key is None:
        return
    tmp = os.path.join(folder, f".{DIGEST_FILE}.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            pickle.dump((key, digest), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, os.path.join(folder, DIGEST_FILE))
    except (OSError, pickle.PicklingError):
        if os.path.exists(tmp):
            os.remove(tmp)


def digest_trace(trace: Any) -> RankDigest:
    """The digest of a loaded trace."""
    from neuron_explorer.analyses import waits_on_path
    from neuron_explorer.rules.ranks.thresholds import SMALL_COLLECTIVE_BYTES
    from neuron_explorer.what_if.merged_collectives import merged_collectives_saving

    info = distributed_info(trace.metadata)
    syncs = waits_on_path.host_syncs(trace)
    coll = _with_analysed(trace, comm.collectives(trace))
    coll["idle_after_ns"] = waits_on_path.idle_after(trace, coll, syncs)
    coll["slack_after_ns"] = waits_on_path.slack_after(trace, coll, syncs)
    communication = comm.communication(trace).copy()
    communication["exposed_transfer_ns"] = comm.exposed_transfer(trace)
    return RankDigest(
        path=trace.path, source_format=trace.source_format, hardware=trace.hardware,
        own_rank=info.get("rank"), world_size=info.get("world_size"),
        summary=trace.summary(), steps=_with_host_sync(trace),
        collectives=coll, communication=communication, syncs=syncs,
        kernel_types=comm.kernel_types(trace), findings=list(trace.bottlenecks()),
        warnings=list(trace.warnings), store=trace.store_folder,
        merged_collectives_ns=merged_collectives_saving(trace, SMALL_COLLECTIVE_BYTES),
        modelled_host_clock=modelled_host_clock(trace))


def _with_host_sync(trace: Any) -> pd.DataFrame:
    """The steps with `host_sync_ns` (the time the host spent waiting on the device in
    each analysed step, -1 in the others), which a straggler's counterfactual reads, and
    `device_busy_ns` (the step's time the device was busy, 0 outside the analysed steps
    and in traces without a device), which tells work from a host's jitter."""
    from neuron_explorer.analyses.critical_path import host_waits_per_step

    steps = trace.steps.copy()
    waits = host_waits_per_step(trace)
    steps["host_sync_ns"] = waits.reindex(steps["step"]).fillna(-1).to_numpy(np.int64) \
        if len(steps) else np.zeros(0, np.int64)
    bd = trace.breakdown()
    device = bd[bd["side"] == "device"]
    busy = (device[device["category"] != "idle"].groupby("step")["ns"].sum()
            if len(device) else pd.Series(dtype=np.int64))
    steps["device_busy_ns"] = busy.reindex(steps["step"]).fillna(0).to_numpy(np.int64) \
        if len(steps) else np.zeros(0, np.int64)
    # where each step's host time went, and its op count: what tells a straggler's extra
    # work (more ops, more Python between them, a slow data loader) from the others'
    host = bd[bd["side"] == "host"]
    for category in HOST_WORK:
        ns = host[host["category"] == category].groupby("step")["ns"].sum()
        steps[f"host_{category}_ns"] = ns.reindex(steps["step"]).fillna(0).to_numpy(np.int64)
    ops = trace.ops
    per_step = ops[ops["step"] >= 0].groupby("step").size() if len(ops) else pd.Series()
    steps["ops"] = per_step.reindex(steps["step"]).fillna(0).to_numpy(np.int64)
    return steps


# the host categories of `breakdown()` a straggler's extra time is looked for in
HOST_WORK = ("python", "op_dispatch", "dataloader", "compile")


def _with_analysed(trace: Any, coll: pd.DataFrame) -> pd.DataFrame:
    """The collectives with `analysed`: whether the host launched the call in the
    analysed (steady) steps, which every per-step figure counts."""
    from neuron_explorer.analyses.step_breakdown import step_windows

    if not len(trace.steps):
        return coll.assign(analysed=True)
    windows = step_windows(trace)
    launched = comm.launch_times(trace, coll["id"].to_numpy(), coll["ts"].to_numpy())
    return coll.assign(analysed=tables.assign_steps(launched, windows) >= 0)
