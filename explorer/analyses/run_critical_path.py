"""The critical path of a run's step, across its ranks.

Each rank's own path (`critical_path.critical_path`) stops at a collective it waited for
(`collective_wait`): its device sat idle until the group's last rank arrived, so what
set the step's length before that point is the last rank's work. Walked back from the
end of the step on the rank that finished it last, the run's path follows each rank's
own chain and, at every such wait, moves to the rank that arrived last, at the time it
arrived, and goes on back along that rank's chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.critical_path import PATH_COLUMNS
from neuron_explorer.analyses.ranks import MATCH_KEYS

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

# Walking the run's critical path loads every rank's whole trace into this process: the
# report and the rules walk it for runs up to this size.
CRITICAL_PATH_MAX_RANKS = 8


def run_critical_path(run: Run, step: int | None = None) -> pd.DataFrame:
    """The chain that set each analysed step of the run (or `step`), across ranks:
    `critical_path`'s columns, `rank` saying whose work each segment is. Needs every
    rank of the run (a partial run's missing ranks may have arrived later)."""
    if not run.ranks or run.missing_ranks:
        return pd.DataFrame(columns=PATH_COLUMNS)
    paths = {r: run[r].critical_path(step).assign(rank=r) for r in run.ranks}
    late = _last_arrivals(run)
    steps = sorted(set.intersection(*(set(p["step"]) for p in paths.values())))
    if step is None and run.analysed_steps:
        steps = [st for st in steps if st in run.analysed_steps]
    rows: list[pd.DataFrame] = []
    for st in steps:
        per_rank = {r: p[p["step"] == st].sort_values("ts") for r, p in paths.items()}
        rows.append(_walk_ranks(per_rank, late))
    if not rows:
        return pd.DataFrame(columns=PATH_COLUMNS)
    return pd.concat(rows, ignore_index=True)[PATH_COLUMNS]


def _last_arrivals(run: Run) -> pd.DataFrame:
    """Per rank's collective call: its arrival, and the rank that arrived last."""
    coll = run.collectives
    if not len(coll):
        return pd.DataFrame(columns=["rank", "arrival", "last_arrival", "last_rank"])
    coll = coll[coll["ranks_arrived"] > 1]
    last = coll.loc[coll.groupby(MATCH_KEYS, sort=False)["arrival"].idxmax(),
                    [*MATCH_KEYS, "rank"]].rename(columns={"rank": "last_rank"})
    return coll.merge(last, on=MATCH_KEYS)[["rank", "arrival", "last_arrival", "last_rank"]]


def _walk_ranks(per_rank: dict[int, pd.DataFrame], late: pd.DataFrame) -> pd.DataFrame:
    """One step: back from the latest end, switching ranks at collective waits."""
    ends = {r: int((p["ts"] + p["dur"]).max()) for r, p in per_rank.items() if len(p)}
    if not ends:
        return pd.DataFrame(columns=PATH_COLUMNS)
    rank = max(ends, key=lambda r: ends[r])
    t = ends[rank]
    out: list[pd.DataFrame] = []
    for _ in range(4 * len(late) + 2 * len(per_rank) + 8):
        path = per_rank[rank]
        before = path[path["ts"] < t]
        if not len(before):
            break
        ends_at = before["ts"] + before["dur"]
        before = before.assign(dur=np.minimum(ends_at, t) - before["ts"])
        waits = before[(before["category"] == "collective_wait") & (before["dur"] > 0)]
        switch = _late_rank(late, rank, waits)
        if switch is None:
            out.append(before)
            break
        wait_end, other = switch
        out.append(before[before["ts"] >= wait_end])
        if other == rank or wait_end >= t:
            out.append(before[before["ts"] < wait_end])
            break
        rank, t = other, wait_end
    if not out:
        return pd.DataFrame(columns=PATH_COLUMNS)
    return pd.concat(out[::-1], ignore_index=True).sort_values("ts", ignore_index=True)


def _late_rank(late: pd.DataFrame, rank: int, waits: pd.DataFrame) -> tuple[int, int] | None:
    """The latest of `rank`'s collective waits in `waits` and the rank it waited for, as
    (the wait's end, that rank), or None."""
    mine = late[late["rank"] == rank]
    for w in waits.sort_values("ts", ascending=False).itertuples():
        end = int(w.ts + w.dur)
        hit = mine[(mine["arrival"] <= w.ts) & (mine["last_arrival"] >= end)]
        if len(hit):
            return int(hit["last_arrival"].iloc[0]), int(hit["last_rank"].iloc[0])
    return None
