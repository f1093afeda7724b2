"""Findings of a run: shares are of the run's step time (the mean rank's total)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, severity

if TYPE_CHECKING:
    from neuron_explorer.run import Run


def run_finding(run: Run, rule_id: str, title: str, time_lost_ns: float,
                evidence_items: list[dict[str, Any]], explanation: str, recommendation: str,
                per_rank: bool = False, symptom_ns: float = 0, saving_basis: str = "") -> Finding:
    """A finding with its share of the run's step time and its severity. A per-rank
    finding's time is that rank's, against one rank's step time."""
    total = run.step_time_ns()
    share = min(max(time_lost_ns / total, 0.0), 1.0) if total > 0 else 0.0
    return Finding(rule_id=rule_id, title=title, severity=severity(share),
                   time_lost_ns=int(max(time_lost_ns, 0)), share_of_step=float(share),
                   evidence=evidence_items[: th.MAX_EVIDENCE], explanation=explanation,
                   recommendation=recommendation, symptom_ns=int(max(symptom_ns, 0)),
                   saving_basis=saving_basis)


def rank_evidence(rank: int, ts: int, dur: int, slice_ids: list[int],
                  description: str) -> dict[str, Any]:
    """An evidence item on one rank's trace (`slice_ids` are that trace's)."""
    return {"rank": int(rank), "ts": int(ts), "dur": int(dur),
            "slice_ids": [int(i) for i in slice_ids], "description": description}
