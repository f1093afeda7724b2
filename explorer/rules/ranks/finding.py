"""Findings of a run: shares are of the run's step time (the mean rank's total)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, severity

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run


def run_finding(run: Run, rule_id: str, title: str, time_lost_ns: float,
                evidence_items: list[dict[str, Any]], explanation: str, recommendation: str,
                per_rank: bool = False, symptom_ns: float = 0, saving_basis: str = "") -> Finding:
    """A finding with its share of the run's step time and its severity. A per-rank
    finding's time is that rank's, against one rank's step time."""
    total = run.analysed_time_ns()
    share = min(max(time_lost_ns / total, 0.0), 1.0) if total > 0 else 0.0
    return Finding(rule_id=rule_id, title=title, severity=severity(share),
                   time_lost_ns=int(max(time_lost_ns, 0)), share_of_step=float(share),
                   evidence=evidence_items[: th.MAX_EVIDENCE], explanation=explanation,
                   recommendation=recommendation, symptom_ns=int(max(symptom_ns, 0)),
                   saving_basis=saving_basis, steps=analysed_step_count(run))


def analysed_step_count(run: Run) -> int:
    """How many steps the run's findings' times are summed over: the run's analysed
    steps, or where the ranks share none, the fewest any rank analysed."""
    if run.analysed_steps:
        return len(run.analysed_steps)
    counts = [len(d.summary.get("steps_analysed") or []) for d in run.digests.values()]
    return min(counts) if counts else 0


def rank_evidence(rank: int, ts: int, dur: int, slice_ids: list[int],
                  description: str) -> dict[str, Any]:
    """An evidence item on one rank's trace (`slice_ids` are that trace's)."""
    return {"rank": int(rank), "ts": int(ts), "dur": int(dur),
            "slice_ids": [int(i) for i in slice_ids], "description": description}


def path_time(run: Run, categories: tuple[str, ...], rank: int | None = None) -> float | None:
    """ns the run's critical path spends in `categories` (on `rank`, if given) over the
    analysed steps: the most a fix of that work can save. None where the path is not
    walked (a partial run, or one of more than `CRITICAL_PATH_MAX_RANKS` ranks)."""
    from neuron_explorer.analyses.run_critical_path import CRITICAL_PATH_MAX_RANKS

    if run.missing_ranks or not 1 < len(run) <= CRITICAL_PATH_MAX_RANKS:
        return None
    path = run.critical_path()
    if not len(path):
        return None
    on = path["category"].isin(categories)
    if rank is not None:
        on &= path["rank"] == rank
    return float(path.loc[on, "dur"].sum())


def capped_by_path(run: Run, estimate: float, basis: str, categories: tuple[str, ...],
                   what: str, rank: int | None = None) -> tuple[float, str]:
    """(saving, `Finding.saving_basis`): the rule's `estimate` (obtained as `basis` says),
    no more than the time the run's critical path spends in `what` (`categories`): work
    off the path saves nothing when it shrinks. The estimate alone where the path is not
    walked."""
    from neuron_explorer.analyses.run_critical_path import CRITICAL_PATH_MAX_RANKS
    from neuron_explorer.units import duration

    on_path = path_time(run, categories, rank)
    if on_path is None:
        return estimate, (f"{basis} (the run's critical path, which would bound it, is "
                          f"walked for complete runs of up to {CRITICAL_PATH_MAX_RANKS} "
                          "ranks only)")
    if on_path < estimate:
        return on_path, (f"critical path: the time the run's critical path spends in {what} "
                         f"({basis} gives more, {duration(estimate)})")
    return estimate, (f"{basis}, within the {duration(on_path)} the run's critical path "
                      f"spends in {what}")


def own_work_per_rank(run: Run) -> pd.Series | None:
    """Per rank, its own work over the steps every rank analysed (`ranks.own_work`); None
    for a run of one rank, a partial run, or one without the figures."""
    from neuron_explorer.analyses.ranks import own_work

    if len(run.digests) < 2 or run.missing_ranks:
        return None
    work = own_work(run)
    if len(work) < 2 or not work.shape[1]:
        return None
    return work.sum(axis=1)


def pace_saving(own: pd.Series, saved: dict[int, float]) -> float:
    """What the run saves when each rank's own work (`own`) shrinks by `saved`: the ranks
    meet at collectives, so the run moves at the largest own work, and saves that pace
    less the largest own work after."""
    after = own - pd.Series(saved, dtype=float).reindex(own.index).fillna(0.0)
    return max(float(own.max()) - float(after.max()), 0.0)
