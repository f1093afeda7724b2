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
        "path is lost." + _extra_work(run, rank) + _maybe_the_machine(run, rank, lost),
        f"Look at what rank {rank} does between collectives that the others do not: extra "
        "host work (logging, metrics, checkpointing or evaluation on one rank only), a larger "
        "or slower batch from its data loader, or a slower device. Move work done on one rank "
        "only off the step's critical path (every N steps, or asynchronously), and give every "
        "rank the same amount of data per step." + _shared_evenly(run, rank, lost),
        symptom_ns=float(worst["wait_caused_ns"]),
        saving_basis="critical path: the slowest rank's own work per step (its length less "
                     "the waits for others that its host paid, matched to its syncs in "
                     "time) against the next slowest rank's")]


def _shared_evenly(run: Run, rank: int, lost: float) -> str:
    """Where the straggler runs the others' ops on more data (device work, the same ops):
    what splitting the data evenly saves beside the headline's dropping its extra work. The
    ranks then move at about the mean rank's pace: a user's ranks given 1536 and 512 rows
    were claimed 1.03 ms a step (what giving rank 0 the other's 512 saved), and 1024 each
    saved 0.70."""
    from neuron_explorer.analyses.ranks import own_work

    if _where(run, rank) != ("device_busy", True):
        return ""
    per_step = own_work(run)
    work = per_step.sum(axis=1)
    if len(work) < 2 or not per_step.shape[1]:
        return ""
    even = float(work.max() - work.mean())
    if not 0 < even < lost:
        return ""
    return (f" That saving is rank {rank}'s extra work dropped; its extra is data the ranks "
            "could share (the same ops on more of it): split evenly, every rank takes the "
            f"mean share and the run saves about {us(even)} ({us(even / per_step.shape[1])} "
            "a step), the ranks then moving at the mean rank's pace.")


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
    found = _per_rank(run, rank)
    if found is None:
        return ""
    mine, others, extra = found
    where = max(extra, key=extra.__getitem__)
    if extra[where] <= 0:
        return ""
    ops = (f"the same {mine['ops']:.0f} ops a step as the others" if _same_ops(mine, others)
           else f"{mine['ops']:.0f} ops a step against the others' {others['ops']:.0f}")
    return (f" Per step, rank {rank} spends {us(extra[where])} more than the others in "
            f"{_WHERE[where]}, running {ops}.")


def _maybe_the_machine(run: Run, rank: int, lost: float) -> str:
    """A small excess in the host's own Python, running the same ops as the others: what a
    busier CPU (another process, fewer cores than processes) gives the same code too."""
    if _where(run, rank) != ("host_python", True):
        return ""
    if lost >= th.STRAGGLER_MACHINE_SHARE * run.analysed_time_ns():
        return ""
    return (" A difference this small in the host's own Python, running the same ops, is "
            "also what a busier CPU gives the same code (other processes on the machine, "
            "or more processes than cores): record the run again and see whether the same "
            f"rank is late again before changing rank {rank}'s code.")


def _per_rank(run: Run, rank: int) -> tuple | None:
    """(the rank's medians, the others' medians, its excess per part of the step); None
    for a digest from before these were kept, or a rank alone."""
    steps = run.steps
    columns = [c for c in (*(f"{w}_ns" for w in _WHERE), "ops") if c in steps]
    if "ops" not in columns or "host_sync_ns" not in steps:
        return None
    steps = steps[steps["host_sync_ns"] >= 0]
    per_rank = steps.groupby("rank")[columns].median()
    if rank not in per_rank.index or len(per_rank) < 2:
        return None
    mine, others = per_rank.loc[rank], per_rank.drop(index=rank).median()
    return mine, others, {c[:-3]: float(mine[c] - others[c]) for c in columns if c != "ops"}


def _same_ops(mine, others) -> bool:
    return bool(abs(mine["ops"] - others["ops"]) <= 0.01 * max(others["ops"], 1))


def _where(run: Run, rank: int) -> tuple[str, bool] | None:
    """(the part of the step where the rank's excess is largest, whether it runs the same
    ops as the others)."""
    found = _per_rank(run, rank)
    if found is None:
        return None
    mine, others, extra = found
    return max(extra, key=extra.__getitem__), _same_ops(mine, others)
