"""A bottleneck finding, and the helpers every rule uses to build one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer.rules import thresholds as th
from neuron_explorer.units import duration

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


@dataclass
class Finding:
    """One bottleneck: what, how much time it costs, where (evidence), and what to change."""

    rule_id: str
    title: str
    severity: str  # "high" | "medium" | "low"
    time_lost_ns: int
    share_of_step: float  # 0..1
    evidence: list[dict[str, Any]] = field(default_factory=list)  # ts, dur, slice_ids, description
    explanation: str = ""
    recommendation: str = ""
    share_base: str = "the analysed steps"  # what share_of_step is a share of, in words
    # time_lost_ns is what fixing the cause would save; the symptom's own total (the waits,
    # the gaps) is kept beside it as evidence, with how the saving was obtained
    symptom_ns: int = 0
    saving_basis: str = ""  # "replay: ...", "critical path: ..." or "estimate: ..."
    after: str = ""  # the rule whose fix must come first for this saving ("" if none)
    steps: int = 0  # the analysed steps time_lost_ns is summed over (0: not per step)
    # of time_lost_ns, what the first analysed step saves once beyond the others (an
    # optimizer's state made in its first step), or, below 0, saves less than they do (a
    # fix's one-time cost there): "a step" is then the others'
    once_ns: int = 0

    def saving_note(self) -> str:
        """How `time_lost_ns` was obtained and the symptom's own total, in words ("" for a
        finding whose time lost is its symptom's)."""
        if not self.saving_basis:
            return ""
        symptom = f"; the symptom totals {duration(self.symptom_ns)}" if self.symptom_ns else ""
        return f"Saving from {self.saving_basis}{symptom}."

    @property
    def saves_time(self) -> bool:
        """Whether fixing the cause would save any time now (a cause off the critical path,
        or hidden behind other work, saves none: its finding says why)."""
        return self.time_lost_ns > 0

    def per_step(self) -> str:
        """The time lost a step, in words, where it is summed over several steps ("" else):
        the total beside a step time of a fraction of it read as lost in each ("32.84 ms
        lost" on a 5.5 ms step)."""
        from neuron_explorer.render import fmt_ns

        if self.steps < 2:
            return ""
        each = f"{fmt_ns((self.time_lost_ns - self.once_ns) / self.steps)} a step over " \
            f"{self.steps} steps"
        if self.once_ns > 0:
            return f"{each} and {fmt_ns(self.once_ns)} more in the first"
        if self.once_ns < 0:
            # "less a one-time X in the first" read as the first step growing slower
            return f"{each}; the first of them saves {fmt_ns(-self.once_ns)} less than the others"
        return each

    def line(self) -> str:
        """The finding as one line of a text report."""
        from neuron_explorer.render import fmt_ns, fmt_share

        note = self.saving_note()
        each = f"{self.per_step()}, " if self.per_step() else ""
        cost = (f"{fmt_ns(self.time_lost_ns)} lost ({each}{fmt_share(self.share_of_step)} of "
                f"{self.share_base})" if self.saves_time else "no time to save now")
        return (f"[{self.severity}] {self.title}: {cost}. {self.explanation} "
                f"Fix: {self.recommendation}" + (f" {note}" if note else ""))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field, and `saves_time`: a finding that saves nothing now
        (listed apart in the text report) reads as such without comparing numbers."""
        return {**asdict(self), "saves_time": self.saves_time}

    def _repr_html_(self) -> str:
        from neuron_explorer.plot.cards import finding_card

        return finding_card(self)


class Findings(list):
    """A list of findings that Jupyter shows as cards, worst first."""

    def _repr_html_(self) -> str:
        from neuron_explorer.plot.cards import findings_cards

        return findings_cards(self)


SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}
# the title reports give the findings `ranked` orders
FINDINGS_TITLE = "Findings (ranked by time lost, each after the fix it waits on)"
# below the ranked ones: a cause seen whose fix would save nothing now, each saying why
NO_SAVING_TITLE = "Also seen, saving no time now"


def ranked(findings: list[Finding]) -> Findings:
    """Worst first: by time lost, except that a finding whose saving comes only after
    another fix (`after`) never ranks above that fix's finding: that finding moves up to
    just above the first finding waiting on it. (Ranking the waiting ones at most at
    that fix's saving once put a host-bound finding's 0 ns above a medium 1.21 ms one and
    every finding after it out of order.)"""
    lost = {f.rule_id: f.time_lost_ns for f in findings}
    opens: dict[str, int] = {}  # per prerequisite rule: the largest saving waiting on it
    for f in findings:
        if f.after in lost:
            opens[f.after] = max(opens.get(f.after, 0), f.time_lost_ns)

    def key(f: Finding) -> tuple:
        rank_by = max(f.time_lost_ns, opens.get(f.rule_id, 0))
        return (-rank_by, f.after in lost, -f.time_lost_ns, SEVERITY_RANK[f.severity])

    return Findings(sorted(findings, key=key))


def sections(findings: list[Finding], unseen: Sequence[str] = ()) -> list[Any]:
    """A report's findings sections: those that save time, ranked, with what the trace
    could not show (`unseen`), then those that save none now (listed at "0 ns lost" among
    them, they read as ranked bottlenecks)."""
    from neuron_explorer.render import Section

    saving = [f.line() for f in findings if f.saves_time]
    saving += unseen
    none_now = [f.line() for f in findings if not f.saves_time]
    return [Section(FINDINGS_TITLE, saving or ["no bottleneck found"]),
            *([Section(NO_SAVING_TITLE, none_now)] if none_now else [])]


def evidence(ts: int, dur: int, slice_ids: list[int], description: str) -> dict[str, Any]:
    """One evidence item: a time range, the slices in it and what they show."""
    return {"ts": int(ts), "dur": int(dur), "slice_ids": [int(i) for i in slice_ids],
            "description": description}


def named_sites(sources: pd.Series, steps: int, most: int = 3) -> str:
    """The program lines of `sources` seen most (none where empty), each with how often:
    "train.py:42 (2x a step), train.py:50 (3 in all)"."""
    counts = sources[sources != ""].value_counts()
    return ", ".join(f"{site} ({n // steps}x a step)" if n >= steps else f"{site} ({n} in all)"
                     for site, n in counts.head(most).items())


def top(frame: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """The rows a finding shows as evidence: the first `MAX_EVIDENCE`, largest `by` first
    (sorting first keeps the choice the same as sorting every row)."""
    if by is not None:
        frame = frame.sort_values(by, ascending=False)
    return frame.head(th.MAX_EVIDENCE)


def severity(share: float) -> str:
    """Severity from the share of step time lost."""
    if share >= th.SEVERITY_HIGH_SHARE:
        return "high"
    if share >= th.SEVERITY_MEDIUM_SHARE:
        return "medium"
    return "low"


def step_time(trace: Trace) -> float:
    """The total analysed step time in ns (the trace's span without steps)."""
    from neuron_explorer.analyses.statistics import total_step_ns

    return total_step_ns(trace)


def share_base(rule_id: str, has_steps: bool) -> str:
    """What a finding's share of time is of, in the report's words: what its rule says
    (`SHARE_BASE`, for time outside the steps), else step time (the trace's, without
    steps)."""
    from neuron_explorer.rules import SHARE_BASES  # the rules import this module

    return SHARE_BASES.get(rule_id, "the analysed steps" if has_steps else "the trace")


def make(trace: Trace, rule_id: str, title: str, time_lost_ns: float,
         evidence_items: list[dict[str, Any]], explanation: str, recommendation: str,
         severity_override: str | None = None, share_of: float | None = None,
         symptom_ns: float = 0, saving_basis: str = "", after: str = "",
         once_ns: float = 0) -> Finding:
    """A finding with its share of step time (or of `share_of` ns, for time that is not
    per step, such as compilation) and severity filled in. `time_lost_ns` is what fixing
    the cause would save; `symptom_ns` the symptom's own total, `saving_basis` how the
    saving was obtained, `after` the rule whose fix must come first, `once_ns` the part of
    the saving the first analysed step makes once beyond the others (below 0: less)."""
    total = step_time(trace) if share_of is None else share_of
    share = min(max(time_lost_ns / total, 0.0), 1.0) if total > 0 else 0.0
    level = severity_override or severity(share)
    if after and level == "high":
        level = "medium"  # it saves no step time until the other fix is in
    return Finding(rule_id=rule_id, title=title,
                   severity=level,
                   time_lost_ns=int(max(time_lost_ns, 0)), share_of_step=float(share),
                   evidence=evidence_items[: th.MAX_EVIDENCE], explanation=explanation,
                   recommendation=recommendation,
                   share_base=share_base(rule_id, bool(len(trace.steps))),
                   symptom_ns=int(max(symptom_ns, 0)), saving_basis=saving_basis, after=after,
                   steps=_steps_summed(trace, rule_id) if share_of is None else 0,
                   once_ns=int(min(once_ns, max(time_lost_ns, 0))))


def _steps_summed(trace: Trace, rule_id: str) -> int:
    """How many analysed steps a finding's time is summed over (0 where its share is of
    the whole run, as compiling's)."""
    from neuron_explorer.analyses.step_breakdown import counted_steps

    if not len(trace.steps) or share_base(rule_id, True) != "the analysed steps":
        return 0
    return counted_steps(trace)


def is_inference(trace: Trace) -> bool:
    """Steps are forward calls (no optimizer ran): the recorder says so."""
    return trace.metadata.get("step_boundary") == "forward"


def trains(trace: Trace) -> bool:
    """Whether the run trains: it records a backward or an optimizer step. Advice about
    optimizers, master weights, gradients or saved activations fits only such runs."""
    from neuron_explorer.common import trace_format as tf
    from neuron_explorer.tables import kind_mask

    return bool(kind_mask(trace, (tf.CAT_BACKWARD, tf.CAT_OPTIMIZER)).any())


def step_name(trace: Trace) -> str:
    """What a step is: a forward call (an inference loop's), a training step, or a step a
    user marked in a run that does not train (a request served)."""
    if is_inference(trace):
        return "forward call"
    return "training step" if trains(trace) else "step"


def loop_name(trace: Trace) -> str:
    return "training loop" if trains(trace) and not is_inference(trace) else "inference loop"


def us(ns: float) -> str:
    """A duration for messages: '2.1 s', '1.2 ms', '35 us'."""
    return duration(ns)
