"""Cross-rank analyses of a run: step times per rank, collectives matched across ranks,
stragglers.

A collective call is the same call on every rank of its group when it has the same
group, kind and sequence number. Its last arrival is when the slowest rank reached
it; every other rank waits from its own arrival until then. Our traces record that
wait (`wait_ns`, measured on the simulated interconnect); for PyTorch-profiler
traces it is derived here from the arrival times, which assumes the ranks' clocks
agree (true on one host; across hosts only as well as their clocks are synchronised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.communication import COLLECTIVE_COLUMNS

if TYPE_CHECKING:
    from neuron_explorer.run import Run

MATCH_KEYS = ["group", "collective", "seq"]
STRAGGLER_COLUMNS = ["rank", "arrival_delay_ns", "last_arrivals", "wait_caused_ns",
                     "step_time_ns", "step_excess_ns", "late_share"]
# A rank is late when the others lose at least this share of their step time waiting for
# it, or its steps take at least this much longer than the median rank's.
LATE_SHARE = 0.05


def step_times(run: Run) -> pd.DataFrame:
    """Step duration in ns, one row per rank, one column per step."""
    steps = run.steps
    if not len(steps):
        return pd.DataFrame(index=pd.Index(run.ranks, name="rank"))
    frame = steps.pivot_table(index="rank", columns="step", values="dur", aggfunc="sum")
    return frame.reindex(run.ranks)


def matched_collectives(coll: pd.DataFrame) -> pd.DataFrame:
    """Every rank's collective calls (a `rank` column beside the collectives table) with the
    group's last arrival (`last_arrival`), and `wait_ns`/`transfer_ns` (derived from the
    arrivals where the trace did not record them)."""
    columns = ["rank", *COLLECTIVE_COLUMNS, *(["analysed"] if "analysed" in coll else []),
               "last_arrival", "ranks_arrived"]
    if not len(coll):
        return pd.DataFrame(columns=columns)
    coll = coll.copy()
    grouped = coll.groupby(MATCH_KEYS, sort=False)["arrival"]
    coll["last_arrival"] = grouped.transform("max")
    coll["ranks_arrived"] = coll.groupby(MATCH_KEYS, sort=False)["rank"].transform("nunique")
    derived = np.clip(coll["last_arrival"] - coll["arrival"], 0, coll["dur"])
    unknown = coll["wait_ns"].to_numpy() < 0
    coll.loc[unknown, "wait_ns"] = np.where(coll["ranks_arrived"] > 1, derived, 0)[unknown]
    unknown_transfer = coll["transfer_ns"].to_numpy() < 0
    coll.loc[unknown_transfer, "transfer_ns"] = (coll["dur"] - coll["wait_ns"])[unknown_transfer]
    return coll[columns]


def stragglers(run: Run) -> pd.DataFrame:
    """Ranks that are late: the others wait for them at collectives, or their steps are
    longer than the median rank's. Columns: arrival delay (mean, against the median rank's
    arrival at the same call), how often it arrived last, the wait it caused each other
    rank (total over the run), its step time and excess over the median, and `late_share`
    (the larger of the two costs as a share of the run's step time)."""
    table = rank_lateness(run)
    return table[table["late_share"] >= LATE_SHARE].sort_values(
        "late_share", ascending=False, ignore_index=True)


def step_collectives(run: Run) -> pd.DataFrame:
    """The collectives inside the analysed steps (all of them when the run has no steps):
    the calls of setup (creating groups, the first broadcasts, while ranks start at
    different times) and of compile steps are not steady training."""
    coll = run.collectives
    if len(coll) and "analysed" in coll:
        return coll[coll["analysed"].astype(bool)]
    return coll


def rank_lateness(run: Run) -> pd.DataFrame:
    """`stragglers`' figures for every rank, late or not."""
    coll = step_collectives(run)
    ranks = pd.Index(run.ranks, name="rank")
    out = pd.DataFrame(index=ranks)
    if len(coll):
        multi = coll[coll["ranks_arrived"] > 1].copy()
        median = multi.groupby(MATCH_KEYS)["arrival"].transform("median")
        multi["delay"] = multi["arrival"] - median
        out["arrival_delay_ns"] = multi.groupby("rank")["delay"].mean()
        last = multi[multi["arrival"] == multi["last_arrival"]]
        # a call that one rank reached last: every other rank's wait is that rank's doing
        waits = multi.groupby(MATCH_KEYS)["wait_ns"].sum().rename("others_wait")
        last = last.join(waits, on=MATCH_KEYS)
        n_others = np.maximum(last["ranks_arrived"] - 1, 1)
        last = last.assign(caused=(last["others_wait"] - last["wait_ns"]) / n_others)
        out["last_arrivals"] = last.groupby("rank").size()
        out["wait_caused_ns"] = last.groupby("rank")["caused"].sum()
    for column in ("arrival_delay_ns", "last_arrivals", "wait_caused_ns"):
        if column not in out:
            out[column] = 0
    out = out.fillna(0)
    per_rank_step = run.steps.groupby("rank")["dur"].sum() if len(run.steps) else None
    if per_rank_step is not None:
        out["step_time_ns"] = per_rank_step.reindex(ranks).fillna(0)
        median = float(out["step_time_ns"].median())
        out["step_excess_ns"] = np.maximum(out["step_time_ns"] - median, 0)
    else:
        out["step_time_ns"] = 0
        out["step_excess_ns"] = 0
    total = run.step_time_ns()
    cost = np.maximum(out["wait_caused_ns"], out["step_excess_ns"])
    out["late_share"] = cost / total if total > 0 else 0.0
    out = out.reset_index()
    for column in ("arrival_delay_ns", "wait_caused_ns", "step_time_ns", "step_excess_ns"):
        out[column] = out[column].round().astype(np.int64)
    out["last_arrivals"] = out["last_arrivals"].astype(np.int64)
    return out[STRAGGLER_COLUMNS]
