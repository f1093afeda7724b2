"""`Run`: a distributed run as a whole, one trace per rank.

`neuron_explorer.load(folder)` or `load([paths...])` returns a Run. It loads the
ranks in parallel worker processes (one per core) and keeps only each rank's digest
(rank_digest.py), so a run larger than memory still loads; `run[rank]` loads one
rank's full `Trace` when asked. Tables carry a `rank` column; analyses that compare
ranks live in `analyses/ranks.py`, their rules in `rules/ranks/`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pandas as pd
from neuron_explorer.errors import NeuronExplorerError
from neuron_explorer.rank_digest import RankDigest, digest_file
from neuron_explorer.run_files import assign_ranks, read_manifest, run_paths

if TYPE_CHECKING:
    from neuron_explorer.plot import RunPlot
    from neuron_explorer.rules.finding import Findings
    from neuron_explorer.trace import Trace

RUN_SQL_TABLES = ("steps", "ops", "kernels", "collectives", "communication")
T = TypeVar("T")


def load_run(source: str | os.PathLike | Iterable[str | os.PathLike],
             processes: int | None = None, progress: bool | None = None) -> Run:
    """Load a run: a folder of per-rank traces or a list of paths. `processes`: worker
    processes (default: one per core, at most one per file; 1 loads in this process);
    `progress`: a bar on stderr (default: when stderr is a terminal and it takes > 1 s)."""
    paths = run_paths(source)
    folder = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    digests = map_ranks(digest_file, paths, processes, progress, "loading ranks")
    ranks = assign_ranks(paths, [d.own_rank for d in digests])
    manifest = read_manifest(folder) if folder else {}
    return Run(dict(zip(ranks, digests, strict=True)), folder, manifest, processes)


def map_ranks(function: Callable[[str], T], paths: list[str], processes: int | None,
              progress: bool | None, what: str) -> list[T]:
    """`function(path)` for every path, in worker processes when there are several, in
    path order, with a progress bar."""
    from tqdm.auto import tqdm

    workers = min(processes or os.cpu_count() or 1, len(paths))
    bar = tqdm(total=len(paths), desc=what, unit="rank", file=sys.stderr, delay=1.0,
               disable=(not progress) if progress is not None else None, leave=False)
    try:
        if workers <= 1:
            results = []
            for path in paths:
                results.append(function(path))
                bar.update()
            return results
        import multiprocessing

        # fork: workers start at once and inherit the imported explorer; the explorer
        # runs no threads of its own that a fork could break
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(function, p) for p in paths]
            for future in futures:
                future.add_done_callback(lambda _f: bar.update())
            return [f.result() for f in futures]
    finally:
        bar.close()


def _load_table(path: str, name: str) -> pd.DataFrame:
    import warnings

    from neuron_explorer.trace import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(path).table(name)


class Run:
    """A multi-rank run: its ranks, per-rank tables with a `rank` column, and analyses
    across ranks (step times, stragglers, communication, findings)."""

    def __init__(self, digests: dict[int, RankDigest], path: str | None = None,
                 manifest: dict[str, Any] | None = None, processes: int | None = None) -> None:
        if not digests:
            raise NeuronExplorerError("a run needs at least one rank")
        self.digests = dict(sorted(digests.items()))
        self.path = path
        self.manifest = manifest or {}
        self.processes = processes
        self._traces: dict[int, Trace] = {}
        self._cache: dict[str, Any] = {}

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

            self._traces[rank] = cast("Trace", load(self.digests[rank].path))  # one file: a Trace
        return self._traces[rank]

    @property
    def warnings(self) -> list[str]:
        """Each rank's load warnings (a truncated rank, parts left out), named by rank."""
        return [f"rank {r}: {w}" for r, d in self.digests.items() for w in d.warnings]

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
    def collectives(self) -> pd.DataFrame:
        """One row per collective call per rank: rank, seq, collective, ts, dur, bytes,
        group, wait_ns, transfer_ns, ... (waits derived across ranks where not recorded)."""
        from neuron_explorer.analyses.ranks import matched_collectives

        return matched_collectives(self._concat(lambda d: d.collectives))

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Every rank's ops (loads each rank's trace again, in worker processes)."""
        return self._full_table("ops")

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Every rank's kernels (loads each rank's trace again, in worker processes)."""
        return self._full_table("kernels")

    def _full_table(self, name: str) -> pd.DataFrame:
        paths = list(self.paths().values())
        frames = map_ranks(partial(_load_table, name=name), paths, self.processes, None,
                           f"reading {name}")
        parts = [f.assign(rank=r) for r, f in zip(self.ranks, frames, strict=True)]
        frame = pd.concat(parts, ignore_index=True)
        return frame[["rank", *[c for c in frame.columns if c != "rank"]]]

    def table(self, name: str) -> pd.DataFrame:
        """A run table by name (the names `sql` knows)."""
        if name not in RUN_SQL_TABLES:
            raise NeuronExplorerError(f"no run table {name!r}; tables are "
                                      f"{', '.join(RUN_SQL_TABLES)}")
        return self.communication() if name == "communication" else getattr(self, name)

    def sql(self, query: str) -> pd.DataFrame:
        """DuckDB SQL over the run's tables (each with a `rank` column)."""
        from neuron_explorer.sql import query_tables

        return query_tables(query, RUN_SQL_TABLES, self.table)

    # --- analyses -------------------------------------------------------------------------
    def step_time_ns(self) -> float:
        """The run's analysed step time: the mean over ranks of each rank's total."""
        totals = [float(d.summary.get("total_ns") or 0) for d in self.digests.values()]
        return sum(totals) / len(totals) if totals else 0.0

    def step_times(self) -> pd.DataFrame:
        """Step duration (ns) per rank (rows) and step (columns)."""
        from neuron_explorer.analyses.ranks import step_times

        return step_times(self)

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
        wait = coll.groupby("rank")["wait_ns"].sum() if len(coll) else pd.Series(dtype=float)
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
        """The run's figures (plotly): `run.plot.step_times()`, `.communication()`, `.collectives()`."""
        from neuron_explorer.plot import RunPlot

        return RunPlot(self)

    def _repr_html_(self) -> str:
        from neuron_explorer.plot.cards import run_table

        return run_table(self)

    def __repr__(self) -> str:
        where = os.path.basename(self.path) if self.path else f"{len(self)} files"
        return f"<Run {where}: {len(self)} ranks {self.ranks}>"
