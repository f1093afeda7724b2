"""Straggler rank: one rank reaches the collectives late, and every other rank waits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.ranks import step_collectives
from neuron_explorer.rules.finding import Finding, top, us
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import rank_evidence, run_finding

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

RULE_ID = "straggler_rank"


def check(run: Run) -> list[Finding]:
    if len(run) < 2:
        return []
    late = run.stragglers()
    if not len(late):
        return []
    worst = late.iloc[0]
    rank = int(worst["rank"])
    lost = float(worst["saving_ns"])
    if lost < th.STRAGGLER_MIN_SHARE * run.analysed_time_ns():
        return []
    coll = step_collectives(run)
    first = coll.groupby(["group", "collective", "seq"])["arrival"].transform("min")
    coll = coll.assign(behind=coll["arrival"] - first)
    theirs = coll[(coll["rank"] == rank) & (coll["arrival"] == coll["last_arrival"])
                  & (coll["ranks_arrived"] > 1)]
    items = [rank_evidence(rank, r.ts, r.dur, [r.id],
                           f"rank {rank} reached {r.collective} #{r.seq} last, "
                           f"{us(r.behind)} after the first rank")
             for r in top(theirs, "behind").itertuples()]
    others = [r for r in run.ranks if r != rank]
    return [run_finding(
        run, RULE_ID, f"Rank {rank} is a straggler: the run would save {us(lost)} if it "
        "did no more work than the others", lost, items,
        f"Rank {rank} arrived last at {int(worst['last_arrivals'])} collectives, on average "
        f"{us(worst['arrival_delay_ns'])} after the median rank; "
        + (f"each of the {len(others)} other ranks" if len(others) > 1 else "the other rank")
        + f" spent {us(worst['wait_caused_ns'])} waiting for it in all. Ranks of a "
        "group cannot finish a collective before its last member arrives, so the slowest "
        "rank sets the pace of all; only the part of those waits on the others' critical "
        "path is lost." + _extra_work(run, rank),
        f"Look at what rank {rank} does between collectives that the others do not: extra "
        "host work (logging, metrics, checkpointing or evaluation on one rank only), a larger "
        "or slower batch from its data loader, or a slower device. Move work done on one rank "
        "only off the step's critical path (every N steps, or asynchronously), and give every "
        "rank the same amount of data per step.",
        symptom_ns=float(worst["wait_caused_ns"]),
        saving_basis="critical path: the slowest rank's own work per step (its length less "
                     "the waits for others that its host paid, matched to its syncs in "
                     "time) against the next slowest rank's")]


_WHERE = {"device_busy": "device work (its kernels)",
          "host_python": "its own Python between ops (the script's code on that rank, or a "
                         "slower or busier CPU running it)",
          "host_op_dispatch": "dispatching ops",
          "host_dataloader": "waiting for its data loader",
          "host_compile": "compiling"}


def _extra_work(run: Run, rank: int) -> str:
    """Where the straggler's steps are longer than the other ranks' (medians over the
    analysed steps): the part of the step (device work, the host's Python, dispatch, data
    loading, compiling) that differs most, and whether it runs more ops a step."""
    steps = run.steps
    columns = [c for c in (*(f"{w}_ns" for w in _WHERE), "ops") if c in steps]
    if "ops" not in columns or "host_sync_ns" not in steps:
        return ""  # a digest from before these were kept
    steps = steps[steps["host_sync_ns"] >= 0]
    per_rank = steps.groupby("rank")[columns].median()
    if rank not in per_rank.index or len(per_rank) < 2:
        return ""
    mine, others = per_rank.loc[rank], per_rank.drop(index=rank).median()
    extra = {c[:-3]: float(mine[c] - others[c]) for c in columns if c != "ops"}
    where = max(extra, key=extra.__getitem__)
    if extra[where] <= 0:
        return ""
    ops = (f"the same {mine['ops']:.0f} ops a step as the others"
           if abs(mine["ops"] - others["ops"]) <= 0.01 * max(others["ops"], 1)
           else f"{mine['ops']:.0f} ops a step against the others' {others['ops']:.0f}")
    return (f" Per step, rank {rank} spends {us(extra[where])} more than the others in "
            f"{_WHERE[where]}, running {ops}.")