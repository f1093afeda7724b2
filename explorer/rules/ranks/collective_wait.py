"""Waits at collectives: ranks sit in a collective until its last member arrives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.ranks import step_collectives, typical_wait_saving
from neuron_explorer.rules.finding import Finding, us
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import rank_evidence, run_finding

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

RULE_ID = "collective_wait"


def check(run: Run) -> list[Finding]:
    coll = step_collectives(run)
    if len(run) < 2 or not len(coll):
        return []
    # Calls a straggler reached last are that rank's finding (straggler_rank); what is
    # left are waits spread over many ranks.
    late = run.stragglers()
    by_straggler = coll[coll["rank"].isin(late["rank"]) & (coll["arrival"] == coll["last_arrival"])]
    keys = ["group", "collective", "seq"]
    theirs = coll.merge(by_straggler[keys].drop_duplicates(), on=keys, how="left",
                        indicator=True)["_merge"].eq("both").to_numpy()
    waits = coll[(coll["wait_ns"] > 0) & ~theirs]
    symptom = float(waits["wait_ns"].sum()) / len(run)  # per rank, like the step time
    # what no waiting would save: the waits on the ranks' critical paths in a typical
    # step, less what the straggler's own finding already counts
    lost = typical_wait_saving(run) - float(late["saving_ns"].sum())
    if lost < th.COLLECTIVE_WAIT_MIN_SHARE * run.analysed_time_ns():
        return []
    per_rank = waits.groupby("rank")["wait_ns"].sum().sort_values(ascending=False)
    items = [rank_evidence(int(r.rank), r.ts, r.wait_ns, [r.id],
                           f"rank {r.rank} waited {us(r.wait_ns)} in {r.collective} #{r.seq}")
             for r in waits.sort_values("wait_ns", ascending=False).head(5).itertuples()]
    spread = ", ".join(f"rank {r}: {us(v)}" for r, v in per_rank.head(4).items())
    last = coll[(coll["arrival"] == coll["last_arrival"]) & ~theirs]["rank"].nunique()
    cause = f" The last rank to arrive varies: {last} different ranks were last."
    return [run_finding(
        run, RULE_ID, f"Ranks wait at collectives for the last rank: {us(lost)} per rank "
        "on the critical path",
        lost, items,
        f"{len(waits)} collective calls started before every rank of their group had arrived; "
        f"the early ranks idled until the last one came ({spread}), {us(symptom)} per rank "
        f"in all.{cause} Only the waits that held up a rank's step count as lost: those "
        "its host paid when it next waited for the device, in that step or the next (a "
        "host-bound rank queues its next work meanwhile, and the device's idle time "
        "absorbs the wait), less a wait paid once to catch up with a rank that started "
        "late, and less what the ranks' jitter costs even with balanced work.",
        "Even out the work between collectives across ranks (same batch size and sequence "
        "lengths per rank, no work done by one rank only), and launch collectives where every "
        "rank reaches them at the same point of the step.",
        symptom_ns=symptom,
        saving_basis="critical path: the waits each rank's host paid (each carried to "
                     "the next sync unless device idle absorbed it), each step's capped at "
                     "3x the rank's median (a one-time catch-up saves nothing per step), "
                     "less the jitter floor of ranks doing the same work")]
