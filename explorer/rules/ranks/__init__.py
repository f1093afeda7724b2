"""Rules over a whole run: one module per rule, each `check(run) -> list[Finding]`.

They compare ranks (stragglers, load imbalance) or read communication figures
(exposed communication, waits at collectives, small collectives); thresholds live
in `thresholds.py` beside them. `run_rank_rules` adds each single-trace rule's
worst rank, so a run's findings cover what every rank's report would say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.rules.finding import Finding, Findings, ranked, us
from neuron_explorer.rules.ranks import (
    collective_wait,
    exposed_communication,
    load_imbalance,
    small_collectives,
    straggler_rank,
)
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import own_work_per_rank, pace_saving, run_finding

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

RANK_RULES = (straggler_rank, collective_wait, exposed_communication, small_collectives,
              load_imbalance)
RANK_RULE_IDS = tuple(rule.RULE_ID for rule in RANK_RULES)
WAIT_RULES = (straggler_rank.RULE_ID, collective_wait.RULE_ID)
# rules that compare ranks: a run holding fewer ranks than its world cannot support them
COMPARING_RULES = (*WAIT_RULES, load_imbalance.RULE_ID)


def run_rank_rules(run: Run) -> Findings:
    """Cross-rank findings, then the worst rank's finding of each single-trace rule."""
    findings: list[Finding] = []
    for rule in RANK_RULES:
        if run.missing_ranks and rule.RULE_ID in COMPARING_RULES:
            continue  # the missing ranks' arrivals and work are unknown: no verdict
        findings.extend(rule.check(run))
    explained = set()
    if any(f.rule_id in WAIT_RULES for f in findings):
        # a device idle at collectives for other ranks: the cross-rank finding says why
        # and what removing the cause saves; the rank's own view would count it again
        explained.update({"dependency_idle", "queued_idle", "launch_delay"})
    stragglers = [f.time_lost_ns for f in findings if f.rule_id == straggler_rank.RULE_ID]
    findings.extend(f for f in _worst_rank_findings(run, max(stragglers, default=0.0))
                    if f.rule_id not in explained)
    return ranked(findings)


def _worst_rank_findings(run: Run, straggler_ns: float = 0.0) -> list[Finding]:
    """For each single-trace rule, the rank its words come from, named in the title (the
    rank setting the run's pace where it has the finding, else the rank where it costs
    most: `_rank_shown`), with what its fix saves the run (`_run_saving`). Where that is
    the straggler finding's time (`straggler_ns`: the fix takes the pace rank down to the
    others' pace, as removing its extra work would), the explanation says so: the two
    claimed the same 31.5 ms a run side by side."""
    by_rule: dict[str, dict[int, Finding]] = {}
    for rank, digest in run.digests.items():
        for f in digest.findings:
            if f.rule_id in RANK_RULE_IDS:  # the run's own rule covers it across ranks
                continue
            by_rule.setdefault(f.rule_id, {})[rank] = f
    own = own_work_per_rank(run)
    pace = int(own.idxmax()) if own is not None else None
    out = []
    for ranks in by_rule.values():
        rank, f = _rank_shown(ranks, pace)
        also = len(ranks) - 1
        where = f"rank {rank}" + (f" (and {also} other rank{'s' * (also > 1)})" if also else "")
        lost, basis, explanation = float(f.time_lost_ns), f.saving_basis, f.explanation
        if own is not None and f.saves_time:  # a finding that saves no time keeps its words
            lost = _run_saving(run, f.rule_id, own)
            if straggler_ns and f.time_lost_ns > lost >= th.SAME_AS_STRAGGLER * straggler_ns:
                explanation += (f" On rank {rank} alone its fix takes off {us(f.time_lost_ns)}; "
                                "the run then moves at about the other ranks' pace, as it "
                                "would without the straggler's extra work: the straggler "
                                "finding's time is in this saving (the two overlap, not add).")
            basis = ((basis or "each rank's own finding") + "; across ranks: the ranks meet "
                     "at collectives, so the run moves at the pace of the slowest rank's own "
                     "work, and the fix (on every rank) saves the run what it takes off that "
                     "pace")
        found = run_finding(run, f.rule_id, f"{f.title} on {where}", lost,
                            [dict(e, rank=rank) for e in f.evidence], explanation,
                            f.recommendation, per_rank=True, symptom_ns=f.symptom_ns,
                            saving_basis=basis)
        found.after = f.after
        out.append(found)
    return out


def _rank_shown(ranks: dict[int, Finding], pace: int | None) -> tuple[int, Finding]:
    """The rank whose finding a run shows: the pace rank's, whose fix is what shortens the
    run, else the largest claim. A host-bound rank waiting for a slower one claimed its
    device time "after the host-bound fix", a fix that saved the run nothing."""
    if pace in ranks and ranks[pace].saves_time:
        return pace, ranks[pace]
    return max(ranks.items(), key=lambda item: item[1].time_lost_ns)


def _run_saving(run: Run, rule_id: str, own: pd.Series) -> float:
    """What a rank rule's fix, made in the script and so on every rank, saves the run: the
    pace (the largest own work) less the largest own work once each rank saves what its
    finding says. A rank waiting for a straggler saves the run nothing alone: a sync it
    waited at for the straggler was claimed 16.9 ms on a DDP run where removing it saved
    0.6 ms. A rank's finding that saves only after another fix (device time on a
    host-bound rank) takes nothing off its own work now: a host-bound rank's FP32 matmuls,
    taken off its own work, made autocast look like it saved the run 104 us a step where
    it ran 81 us slower."""
    saved = {rank: max((f.time_lost_ns for f in d.findings
                        if f.rule_id == rule_id and not f.after), default=0.0)
             * run.share_in_run_steps(rank) for rank, d in run.digests.items()}
    return pace_saving(own, saved)


__all__ = ["RANK_RULES", "RANK_RULE_IDS", "run_rank_rules"]
