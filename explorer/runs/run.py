"""`Run`: a distributed run as a whole, one trace per rank.

`neuron_explorer.load(folder)` or `load([paths...])` returns a Run. It loads the
ranks in parallel worker processes (one per core) and keeps only each rank's digest
(runs/digest.py), so a run larger than memory still loads; `run[rank]` loads one
rank's full `Trace` when asked. Tables carry a `rank` column; analyses that compare
ranks live in `analyses/ranks.py`, their rules in `rules/ranks/`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import pandas as pd
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.runs.digest import RankDigest, digest_file
from neuron_explorer.runs.files import assign_ranks, read_manifest, run_paths

if TYPE_CHECKING:
    from neuron_explorer.plot import RunPlot
    from neuron_explorer.rules.finding import Findings
    from neuron_explorer.trace import Trace

# the digests' tables, then the tables of every rank's store (read from Parquet)
DIGEST_TABLES = ("steps", "collectives", "communication")
STORE_TABLES = ("slices", "args", "tracks", "counters", "flows", "ops", "kernels",
                "instructions", "modules")
RUN_SQL_TABLES = DIGEST_TABLES + tuple(t for t in STORE_TABLES if t not in DIGEST_TABLES)
T = TypeVar("T")


def load_run(source: str | os.PathLike | Iterable[str | os.PathLike],
             processes: int | None = None, progress: bool | None = None, *,
             cache: bool | None = None, scheduler: str | None = None) -> Run:
    """Load a run: a folder of per-rank traces or a list of paths. `processes`: worker
    processes (default: one per core, at most one per file; 1 loads in this process);
    `progress`: a bar on stderr (default: when stderr is a terminal and it takes > 1 s);
    `cache`: keep and read each rank's tables in the trace cache (default: on unless
    `NEURON_EXPLORER_CACHE=off`); `scheduler`: run the per-rank work on Dask, `"local"`
    (a LocalCluster of `processes` workers) or a scheduler's address."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = run_paths(source)
    for w in caught:  # the files left out, said again where the caller sees them
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    folder = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    digests = map_ranks(partial(digest_file, cache=cache), paths, processes, progress,
                        "loading ranks", scheduler)
    ranks = assign_ranks(paths, [d.own_rank for d in digests])
    manifest = read_manifest(folder) if folder else {}
    run = Run(dict(zip(ranks, digests, strict=True)), folder, manifest, processes,
              cache=cache, scheduler=scheduler)
    run.folder_warnings = [str(w.message) for w in caught]
    return run


def map_ranks(function: Callable[[str], T], paths: list[str], processes: int | None,
              progress: bool | None, what: str, scheduler: str | None = None) -> list[T]:
    """`function(path)` for every path, in worker processes when there are several (or
    as Dask tasks when `scheduler` is given), in path order, with a progress bar."""
    from tqdm.auto import tqdm

    workers = min(processes or os.cpu_count() or 1, len(paths))
    context = _context()  # before the bar: its monitor is a thread of its own
    bar = tqdm(total=len(paths), desc=what, unit="rank", file=sys.stderr, delay=1.0,
               disable=(not progress) if progress is not None else None, leave=False)
    try:
        if scheduler:
            from neuron_explorer.runs.cluster import dask_map

            return dask_map(function, paths, scheduler, processes, bar.update)
        if workers <= 1:
            results = []
            for path in paths:
                results.append(function(path))
                bar.update()
            return results
        if context.get_start_method() != "fork":  # the server's environment is its start's
            function = _InEnvironment(function, dict(os.environ))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool, \
                _main_not_rerun():  # the workers start as the tasks are submitted
            futures = [pool.submit(function, p) for p in paths]
            for future in futures:
                future.add_done_callback(lambda _f: bar.update())
            return [f.result() for f in futures]
    finally:
        bar.close()


def _context():
    """fork where this process runs one thread: workers start at once and inherit the
    imported explorer. With other threads (the dashboard's server and its background
    findings, a notebook's), a fork copies whatever lock one of them held at that moment,
    locked for good: a worker then hung in `functools.cached_property`, whose lock Python
    3.11 shares across instances. Those workers come from a fork server instead, a
    single-threaded process that imports the explorer once."""
    import multiprocessing
    import threading

    if threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["neuron_explorer.trace", "neuron_explorer.runs.digest"])
    return context


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """Workers started meanwhile from a fork server do not run the caller's script again:
    multiprocessing runs `__main__` in each (as `__mp_main__`) where it names its file or
    module, so a script loading a run at its top level, not under `if __name__ ==
    "__main__":`, loaded it again in every worker and failed in their bootstrap. The
    workers run the explorer's functions only, none of the script's."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    hidden: dict[str, Any] = {name: main.__dict__[name] for name in ("__spec__", "__file__")
              if name in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(hidden)


@dataclass(frozen=True)
class _InEnvironment:
    """`function` run under the environment the caller had (the cache folder, the clock):
    a fork server's workers inherit the server's, from when it started."""

    function: Callable
    environ: dict[str, str]

    def __call__(self, path: str):
        for name in set(os.environ) - set(self.environ):
            del os.environ[name]
        os.environ.update(self.environ)
        return self.function(path)


def _load_table(path: str, name: str, cache: bool | None = None) -> pd.DataFrame:
    import warnings

    from neuron_explorer.trace import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(path, cache=cache).table(name)


def _table_file(path: str, name: str, cache: bool | None = None) -> str | None:
    """The Parquet file of one rank's table in its store (computed and written first when
    absent), or None when the rank is not kept in a store."""
    import warnings

    from neuron_explorer.trace import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cast("Trace", load(path, cache=cache))._parquet_file(name)


class Run:
    """A multi-rank run: its ranks, per-rank tables with a `rank` column, and analyses
    across ranks (step times, stragglers, communication, findings)."""

    def __init__(self, digests: dict[int, RankDigest], path: str | None = None,
                 manifest: dict[str, Any] | None = None, processes: int | None = None, *,
                 cache: bool | None = None, scheduler: str | None = None) -> None:
        if not digests:
            raise NeuronExplorerError("a run needs at least one rank")
        self.digests = dict(sorted(digests.items()))
        self.path = path
        self.manifest = manifest or {}
        self.processes = processes
        self.scheduler = scheduler
        self._cache_setting = cache
        self._traces: dict[int, Trace] = {}
        self._cache: dict[str, Any] = {}
        self._files: dict[str, dict[int, str] | None] = {}
        # what loading the folder left out (empty files, JSON files that are no trace)
        self.folder_warnings: list[str] = []

    # --- ranks ----------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        """The run's ranks, sorted."""
        return list(self.digests)

    def __len__(self) -> int:
        return len(self.digests)

    def __iter__(self) -> Iterator[int]:
        return iter(self.digests)

    def __getitem__(self, rank: int) -> Trace:
        """That rank's full trace (loaded on first use, then kept)."""
        if rank not in self.digests:
            raise KeyError(f"no rank {rank} in this run; ranks are {self.ranks}")
        if rank not in self._traces:
            from neuron_explorer.trace import load

            self._traces[rank] = cast("Trace", load(self.digests[rank].path,
                                                    cache=self._cache_setting))
        return self._traces[rank]

    @property
    def world_size(self) -> int | None:
        """The world size the run's manifest or traces state (None if none does)."""
        stated = [self.manifest.get("world_size")] + [d.world_size for d in self.digests.values()]
        sizes = [int(s) for s in stated if isinstance(s, int) and s > 0]
        return max(sizes) if sizes else None

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of the world that this run holds no trace of (a sampled or partial run)."""
        world = self.world_size
        return [r for r in range(world) if r not in self.digests] if world else []

    def summary(self) -> dict[str, Any]:
        """ranks, world_size, missing_ranks, step_time_ns (the median over ranks of each
        rank's median step), analysed_time_ns (the mean over ranks of the analysed steps'
        total), the slowest rank (by its own work: the one the others wait for) and its
        median step, and `complete` (whether every rank is here: cross-rank findings need
        them all)."""
        ranks = self.rank_summary().dropna(subset=["step_time_ns"])
        slowest = ranks.loc[self._pace(ranks).idxmax()] if len(ranks) else None
        return {"ranks": self.ranks, "world_size": self.world_size,
                "missing_ranks": self.missing_ranks, "complete": not self.missing_ranks,
                "step_time_ns": self.step_time_ns(),
                "analysed_time_ns": self.analysed_time_ns(),
                "slowest_rank": int(slowest["rank"]) if slowest is not None else None,
                "slowest_step_ns": float(slowest["step_time_ns"]) if slowest is not None
                else None}

    def _pace(self, ranks: pd.DataFrame) -> pd.Series:
        """What makes a rank the slowest, per row of `rank_summary`: its own work per step
        (the median of `ranks.own_work`), since ranks that meet at collectives share one
        step time (the one that waits is as slow as the one it waits for); the median step
        where that is unknown (one rank, no collectives)."""
        from neuron_explorer.analyses.ranks import own_work

        own = own_work(self).median(axis=1) if len(self.digests) > 1 else pd.Series()
        if own.dropna().empty:
            return ranks["step_time_ns"]
        return ranks["rank"].map(own).fillna(-1.0)

    @property
    def warnings(self) -> list[str]:
        """The files the folder's load left out, then each rank's load warnings (a
        truncated rank, parts left out), named by rank."""
        return self.folder_warnings + [f"rank {r}: {w}" for r, d in self.digests.items()
                                       for w in d.warnings]

    def paths(self) -> dict[int, str]:
        """Each rank's trace file."""
        return {r: d.path for r, d in self.digests.items()}

    # --- tables ---------------------------------------------------------------------------
    def _concat(self, pick: Callable[[RankDigest], pd.DataFrame]) -> pd.DataFrame:
        frames = [pick(d).assign(rank=r) for r, d in self.digests.items()]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return frame[["rank", *[c for c in frame.columns if c != "rank"]]]

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Every rank's steps: rank, step, ts, dur, id, track_id."""
        return self._concat(lambda d: d.steps)

    @cached_property
    def syncs(self) -> pd.DataFrame:
        """Every rank's waits of the host on the device: rank, ts, dur, step (-1 outside
        the analysed steps)."""
        return self._concat(lambda d: d.syncs)

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """One row per collective call per rank: rank, seq, collective, ts, dur, bytes,
        group, wait_ns, transfer_ns, ... (waits derived across ranks where not recorded)."""
        from neuron_explorer.analyses.ranks import matched_collectives

        return matched_collectives(self._concat(lambda d: d.collectives),
                                   complete=not self.missing_ranks)

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Every rank's ops (loads each rank's trace again, in worker processes)."""
        return self._full_table("ops")

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Every rank's kernels (loads each rank's trace again, in worker processes)."""
        return self._full_table("kernels")

    def _full_table(self, name: str) -> pd.DataFrame:
        files = self.table_files(name)
        if files is not None:  # each rank's Parquet, read here one at a time
            frames = [pd.read_parquet(f) for f in files.values()]
        else:
            frames = map_ranks(partial(_load_table, name=name, cache=self._cache_setting),
                               list(self.paths().values()), self.processes, None,
                               f"reading {name}", self.scheduler)
        parts = [f.assign(rank=r) for r, f in zip(self.ranks, frames, strict=True)]
        frame = pd.concat(parts, ignore_index=True)
        return frame[["rank", *[c for c in frame.columns if c != "rank"]]]

    def table_files(self, name: str) -> dict[int, str] | None:
        """Each rank's Parquet file of a table (`slices`, `ops`, ...: see STORE_TABLES),
        written by the workers where a rank's store lacks it; None when the ranks are not
        kept in a store (the cache is off)."""
        if name not in STORE_TABLES:
            raise NeuronExplorerError(f"no per-rank table {name!r}; tables are "
                                      f"{', '.join(STORE_TABLES)}")
        if name not in self._files:
            known = {r: d.store_file(name) for r, d in self.digests.items()}
            files: list[str | None]
            if not all(d.store for d in self.digests.values()):
                files = [None]  # loaded without the cache: no stores to read
            elif all(known.values()):
                files = list(known.values())
            else:
                files = map_ranks(partial(_table_file, name=name, cache=self._cache_setting),
                                  list(self.paths().values()), self.processes, None,
                                  f"writing {name}", self.scheduler)
            self._files[name] = ({r: f for r, f in zip(self.ranks, files, strict=True) if f}
                                 if all(files) else None)
        return self._files[name]

    def table(self, name: str) -> pd.DataFrame:
        """A run table by name (the names `sql` knows), with a `rank` column. Per-rank
        tables (`slices`, ...) are read into memory whole: prefer `sql` for those."""
        if name not in RUN_SQL_TABLES:
            raise NeuronExplorerError(f"no run table {name!r}; tables are "
                                      f"{', '.join(RUN_SQL_TABLES)}")
        if name == "communication":
            return self.communication()
        if name in DIGEST_TABLES or name in ("ops", "kernels"):
            return getattr(self, name)
        return self._full_table(name)

    def sql(self, query: str) -> pd.DataFrame:
        """DuckDB SQL over the run's tables, each with a `rank` column: steps, collectives
        and communication from the digests; slices, args, tracks, counters, flows, ops,
        kernels, instructions and modules over every rank's Parquet files, read by DuckDB
        as the query needs them (a run larger than memory can be queried)."""
        from neuron_explorer.sql import query_tables

        def parquet(name: str) -> dict[int, str] | None:
            return self.table_files(name) if name in STORE_TABLES else None

        return query_tables(query, RUN_SQL_TABLES, self.table, parquet)

    # --- analyses -------------------------------------------------------------------------
    @cached_property
    def analysed_steps(self) -> tuple[int, ...]:
        """The steps the run's findings compare the ranks over: every rank's analysed
        steps, without a warm-up that one rank's waits for another hid (see
        `analyses.ranks.analysed_steps`); empty where the ranks share no step."""
        from neuron_explorer.analyses.ranks import analysed_steps

        return analysed_steps(self)

    def analysed_time_ns(self) -> float:
        """The time analysed per rank: the mean over ranks of each rank's analysed time
        (its report's, the device's pace where that sets it) in the run's analysed steps
        (`analysed_steps`), the base of the run's findings' shares."""
        totals = [self._time_in_run_steps(rank) for rank in self.digests]
        return sum(totals) / len(totals) if totals else 0.0

    def _time_in_run_steps(self, rank: int) -> float:
        """`rank`'s analysed time, less its steps the run leaves out in the proportion
        their host windows take of its own steps' (all of them where the host set its
        pace; a first step shorter than the rest leaves more than its count's share)."""
        digest = self.digests[rank]
        total = float(digest.summary.get("total_ns") or 0)
        own = digest.summary.get("steps_analysed")
        if not own or not self.analysed_steps or set(own) <= set(self.analysed_steps):
            return total
        dur = self.steps[self.steps["rank"] == rank].groupby("step")["dur"].sum()
        host = float(dur.reindex(own).sum())
        kept = float(dur.reindex([s for s in own if s in self.analysed_steps]).sum())
        return total * kept / host if host > 0 else total * self.share_in_run_steps(rank)

    def share_in_run_steps(self, rank: int) -> float:
        """The share of `rank`'s own analysed steps that the run analyses too
        (`analysed_steps`): its figures over its steps, spread evenly over them, count for
        that share (1 where the ranks share no step)."""
        own = self.digests[rank].summary.get("steps_analysed")
        if not own or not self.analysed_steps:
            return 1.0
        return sum(step in self.analysed_steps for step in own) / len(own)

    def step_time_ns(self) -> float | None:
        """The run's step time: the median over ranks of each rank's median step, as a
        trace's `summary()["step_time_ns"]` (None where no rank has steps)."""
        medians = [float(m) for d in self.digests.values()
                   if (m := d.summary.get("step_time_ns")) is not None]
        return float(np.median(medians)) if medians else None

    def step_times(self) -> pd.DataFrame:
        """Each rank's host step window (ns) per rank (rows) and step (columns); the step
        as the run's pace sets it is `rank_summary()`'s `step_time_ns`."""
        from neuron_explorer.analyses.ranks import step_times

        return step_times(self)

    def critical_path(self, step: int | None = None) -> pd.DataFrame:
        """The chain that set each analysed step's length (or `step`'s), across ranks:
        each rank's own chain (`Trace.critical_path`), moving at a collective wait to the
        rank that arrived last; `rank` says whose work each segment is. Empty for a run
        missing some of its ranks."""
        from neuron_explorer.analyses.run_critical_path import run_critical_path

        return run_critical_path(self, step)

    def stragglers(self) -> pd.DataFrame:
        """Ranks whose steps or arrivals at collectives are late, with by how much."""
        from neuron_explorer.analyses.ranks import stragglers

        if "stragglers" not in self._cache:
            self._cache["stragglers"] = stragglers(self)
        return self._cache["stragglers"]

    def communication(self) -> pd.DataFrame:
        """Per rank and device: compute and communication time, their overlap
        (`overlap_pct`: share of communication time that overlaps compute), the exposed
        communication time."""
        return self._concat(lambda d: d.communication)

    def collective_stats(self) -> pd.DataFrame:
        """Per rank and collective kind, inside the steps: calls, bytes, time, achieved
        algorithm and bus bandwidth (GB/s) over the time spent moving data."""
        from neuron_explorer.analyses.communication import stats_of
        from neuron_explorer.analyses.ranks import step_collectives

        return stats_of(step_collectives(self), keys=("rank", "collective"))

    def kernel_types(self) -> pd.DataFrame:
        """Per rank and device: kernel time in communication, memory and computation."""
        return self._concat(lambda d: d.kernel_types)

    def rank_summary(self) -> pd.DataFrame:
        """One row per rank: steps, step time, compute, communication, exposed, wait."""
        from neuron_explorer.analyses.ranks import rank_lateness

        comm = self.communication()
        per_rank = comm.groupby("rank")[["compute_ns", "communication_ns", "exposed_ns"]].sum() \
            if len(comm) else pd.DataFrame()
        from neuron_explorer.analyses.ranks import step_collectives

        coll = step_collectives(self)
        # waiting for other ranks: on the device, and on the host inside the call
        wait = (coll["wait_ns"].clip(lower=0) + coll["host_wait_ns"]).groupby(coll["rank"]).sum() \
            if len(coll) else pd.Series(dtype=float)
        late = rank_lateness(self).set_index("rank")
        rows = []
        for rank, d in self.digests.items():
            rows.append({
                "rank": rank, "steps": int(d.summary.get("n_steps") or 0),
                "step_time_ns": d.summary.get("step_time_ns"),
                "compute_ns": int(per_rank["compute_ns"].get(rank, 0)) if len(per_rank) else 0,
                "communication_ns": int(per_rank["communication_ns"].get(rank, 0))
                if len(per_rank) else 0,
                "exposed_ns": int(per_rank["exposed_ns"].get(rank, 0)) if len(per_rank) else 0,
                "wait_ns": int(wait.get(rank, 0)),
                "wait_caused_ns": int(late["wait_caused_ns"].get(rank, 0)),
                "path": os.path.basename(d.path),
            })
        return pd.DataFrame(rows)

    def bottlenecks(self) -> Findings:
        """Findings across ranks (stragglers, exposed communication, waits, small
        collectives, load imbalance), then each per-rank rule's worst rank, ranked by
        time lost."""
        from neuron_explorer.rules.ranks import run_rank_rules

        return run_rank_rules(self)

    # --- display --------------------------------------------------------------------------
    @cached_property
    def plot(self) -> RunPlot:
        """The run's figures (plotly): `run.plot.step_times()`, `.communication()`,
        `.collectives()`."""
        from neuron_explorer.plot import RunPlot

        return RunPlot(self)

    def _repr_html_(self) -> str:
        from neuron_explorer.plot.cards import run_table

        return run_table(self)

    def __repr__(self) -> str:
        where = os.path.basename(self.path) if self.path else f"{len(self)} files"
        return f"<Run {where}: {len(self)} ranks {self.ranks}>"


def _digest_store(folder: str) -> RankDigest:
    from neuron_explorer.runs.digest import digest_trace
    from neuron_explorer.trace import load

    digest = digest_trace(load(folder))
    digest.path = folder  # `run[rank]` loads the rank from its store
    return digest


def load_converted_run(folder: str, processes: int | None = None,
                       progress: bool | None = None) -> Run:
    """A run as `neuron-explorer convert RUN_DIR` wrote it: one store per rank."""
    import json

    from neuron_explorer.common.errors import TraceFormatError
    from neuron_explorer.store.parquet import RUN_MANIFEST

    try:
        with open(os.path.join(folder, RUN_MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        ranks = {int(r): os.path.join(folder, sub) for r, sub in manifest["ranks"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TraceFormatError(folder, f"not a readable converted run ({exc}); convert the "
                               "run again with `neuron-explorer convert`") from None
    digests = map_ranks(_digest_store, list(ranks.values()), processes, progress,
                        "loading ranks")
    return Run(dict(zip(ranks, digests, strict=True)), folder, manifest.get("manifest") or {},
               processes)
