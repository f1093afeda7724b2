"""Load imbalance: some ranks compute longer than others, and the rest wait for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.rules.finding import Finding, us
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import capped_by_path, own_work_per_rank, run_finding

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

RULE_ID = "load_imbalance"


def check(run: Run) -> list[Finding]:
    comm = run.communication()
    if len(run) < 2 or not len(comm):
        return []
    compute = comm.groupby("rank")["compute_ns"].sum().reindex(run.ranks).fillna(0)
    busiest, idlest = compute.idxmax(), compute.idxmin()
    hi, lo = float(compute.max()), float(compute.min())
    if hi <= 0 or (hi - lo) / hi < th.LOAD_IMBALANCE_MIN_SPREAD:
        return []
    lost = hi - float(compute.mean())  # what the average rank waits for the busiest one
    if lost < th.LOAD_IMBALANCE_MIN_SHARE * run.analysed_time_ns():
        return []
    late = run.stragglers()
    if len(late) and int(late.iloc[0]["rank"]) == busiest:
        return []  # the straggler finding names this rank, with what its extra work costs
    saving, basis = _saving(run, int(busiest), lost)
    return [run_finding(
        run, RULE_ID, f"Compute differs across ranks: rank {busiest} works "
        + (f"{100 * (hi - lo) / lo:.0f}% longer than rank {idlest}" if lo > 0
           else f"while rank {idlest} computes nothing"), saving, [],
        f"Device compute time ranges from {us(lo)} (rank {idlest}) to {us(hi)} (rank "
        f"{busiest}); synchronous training runs at the pace of the busiest rank, so the "
        f"average rank idles about {us(lost)}.",
        "Give every rank the same work: equal batch sizes, sequence lengths bucketed or "
        "packed the same way on every rank, model shards of equal cost (for pipeline or "
        "tensor parallelism, balance the layers per stage).", symptom_ns=lost,
        saving_basis=basis)]


ESTIMATE = "estimate: the busiest rank's compute above the mean rank's"


def _saving(run: Run, busiest: int, estimate: float) -> tuple[float, str]:
    """(saving, basis): the estimate, no more than the busiest rank's lead in own work
    over the next rank (`straggler_savings`: the ranks move at the pace of the largest
    own work, and work moved onto the others can only raise theirs), else where own work
    is unknown, than the run's critical path spends in its kernels. A host-bound rank
    given the larger batch waited at the all-reduce behind its own host: the walk never
    left it, the path's cap said 0 a step, and balancing saved 43 us of a 45 us lead."""
    from neuron_explorer.analyses.ranks import straggler_savings
    from neuron_explorer.units import duration

    if own_work_per_rank(run) is None:
        return capped_by_path(run, estimate, ESTIMATE, ("kernel",),
                              f"rank {busiest}'s kernels", rank=busiest)
    lead = float(straggler_savings(run).get(busiest, 0))
    if lead < estimate:
        return lead, (f"critical path: rank {busiest}'s own work per step (its length less "
                      "the waits for others on its path) above the next rank's, what the run "
                      f"saves at most when its work shrinks ({ESTIMATE}, gives more, "
                      f"{duration(estimate)})")
    return estimate, (f"{ESTIMATE}, within rank {busiest}'s lead in own work over the next "
                      f"rank, {duration(lead)}")
