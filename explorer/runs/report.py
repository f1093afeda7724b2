"""The report of a multi-rank run, and the diff of two runs: a table per rank, the
run's communication, stragglers and findings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer.analyses.run_critical_path import CRITICAL_PATH_MAX_RANKS
from neuron_explorer.render import Section, fmt_ns, fmt_share, render
from neuron_explorer.rules.finding import sections as findings_sections

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

_PER_RANK_NS = ("compute_ns", "communication_ns", "exposed_ns", "wait_ns")


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records"))


def run_report_dict(run: Run) -> dict[str, Any]:
    """Everything the run report shows, JSON-able."""
    return {
        "run": run.path, "summary": run.summary(), "ranks": _records(run.rank_summary()),
        "manifest": run.manifest,
        "communication": _records(run.communication()),
        "collectives": _records(run.collective_stats()),
        "stragglers": _records(run.stragglers()),
        "findings": [f.to_dict() for f in run.bottlenecks()],
    }


def run_report_sections(run: Run) -> list[Section]:
    """The run report as titled sections."""
    ranks = run.rank_summary()
    head: dict[str, Any] = {"run": run.path or "-", "ranks": len(run)}
    modelled = [r for r, d in run.digests.items() if d.modelled_host_clock]
    if modelled:
        from neuron_explorer.report import MODELLED_CLOCK

        # a rank its sleeps or Python slow is no straggler on this clock: a trial's rank
        # that slept 8 ms a step ran as fast as the others, and nothing said why
        head["host clock"] = (("" if len(modelled) == len(run.digests) else
                               f"ranks {', '.join(map(str, modelled))}: ") + MODELLED_CLOCK
                              + "; a rank that such work slows is no straggler here")
    medians = ranks.dropna(subset=["step_time_ns"]) if len(ranks) else ranks
    if len(medians):
        head["step time (median over ranks)"] = fmt_ns(run.step_time_ns())
        # A synchronous run moves at its slowest rank's pace, and its ranks' steps last
        # alike: the slowest is the one the others wait for (the first of equal steps was
        # named, often a rank that waited), else the longest step where they differ.
        slowest = medians.sort_values(["wait_caused_ns", "step_time_ns"], ascending=False,
                                      kind="stable").iloc[0]
        if slowest["wait_caused_ns"] > 0:
            head["slowest rank"] = (f"rank {int(slowest['rank'])}: the others waited "
                                    f"{fmt_ns(slowest['wait_caused_ns'])} for it")
        elif medians["step_time_ns"].nunique() > 1:
            head["slowest rank"] = (f"rank {int(slowest['rank'])}: "
                                    f"{fmt_ns(slowest['step_time_ns'])} a step")
    if steps := _steps_text(run):
        head["steps analysed"] = steps
    head["analysed time per rank (mean)"] = fmt_ns(run.analysed_time_ns())
    missing = run.missing_ranks
    if missing:
        head["ranks"] = (f"{len(run)} of {run.world_size} ({len(missing)} not in this run: no "
                         "straggler, wait or imbalance verdict across ranks)")
    cut = [r for r, d in run.digests.items()
           if any("(was the recording killed?)" in w for w in d.warnings)]
    if cut:
        head["cut short"] = (", ".join(f"rank {r}" for r in cut) + ": the recording stopped "
                             "before its end (killed?); its last steps are missing")
    if ended := _program_ended_text(run):
        head["program"] = ended
    for key in ("world_size", "preset", "command"):
        if key in run.manifest:
            head[key] = run.manifest[key]
    rank_table = pd.DataFrame({
        "rank": ranks["rank"], "trace": ranks["path"], "steps": ranks["steps"],
        "step (median)": [fmt_ns(v) for v in ranks["step_time_ns"]],
        **{c.removesuffix("_ns"): [fmt_ns(v) for v in ranks[c]] for c in _PER_RANK_NS},
        "others wait for it": [fmt_ns(v) for v in ranks["wait_caused_ns"]]})
    if missing:  # waits against ranks that are not here are unknown, not 0
        rank_table["wait"] = rank_table["others wait for it"] = "-"
    comm = run.communication()
    comm_table = pd.DataFrame({
        "rank": comm["rank"], "device": comm["device"],
        "communication": [fmt_ns(v) for v in comm["communication_ns"]],
        "overlapped": [fmt_share(v / 100) for v in comm["overlap_pct"]],
        "exposed": [fmt_ns(v) for v in comm["exposed_ns"]]})
    stats = run.collective_stats()
    stats_table = pd.DataFrame({
        "rank": stats["rank"], "collective": stats["collective"], "calls": stats["count"],
        "bytes": stats["bytes"], "time": [fmt_ns(v) for v in stats["time_ns"]],
        "algbw GB/s": stats["algbw_gbps"].round(2), "busbw GB/s": stats["busbw_gbps"].round(2)})
    findings = list(run.bottlenecks())
    # the step is a median; the other times are sums, beside it (read as per step once)
    return [Section("Run", head),
            Section("Ranks (step: the median; the other times: totals over the analysed "
                    "steps)", rank_table),
            Section("Communication per rank (totals over the analysed steps)", comm_table),
            Section("Collectives per rank", stats_table),
            *_critical_path_section(run),
            *findings_sections(findings)]


def _steps_text(run: Run) -> str:
    """The steps the run's figures compare the ranks over, and why those where a rank's
    own differ: 'steps 1–7 of 0–7 (...)'."""
    from neuron_explorer.analyses.steady_state import StepSelection

    if not run.analysed_steps:
        return ""
    own = [tuple(d.summary.get("steps_analysed") or ()) for d in run.digests.values()]
    reason = ""
    if any(steps != run.analysed_steps for steps in own):
        reason = "the steps every rank analysed"
        if any(steps and steps[0] < run.analysed_steps[0] for steps in own):
            reason += (", after a warm-up that one rank's waiting for another hid from its "
                       "own step times")
    recorded = tuple(sorted(int(s) for s in run.steps["step"].unique()))
    return StepSelection(run.analysed_steps, recorded, reason).describe()


def _program_ended_text(run: Run) -> str:
    """How the run's program ended where it failed ("" otherwise): the launcher's exit
    code and each rank's own error, so that a crashed run's report never reads as a run."""
    code = int(run.manifest.get("exit_code") or 0)
    ranks = {r: d.summary for r, d in sorted(run.digests.items())
             if d.summary.get("exit_code")}
    if not code and not ranks:
        return ""
    text = f"exited with code {code}" if code else "a rank failed"
    for rank, s in ranks.items():
        text += f"; rank {rank} exited with code {s['exit_code']}" + (
            f": {s['program_error']}" if s.get("program_error") else "")
    return text + "; the traces hold what ran until then"


def _critical_path_section(run: Run) -> list[Section]:
    """Whose work set the steps, by rank and category (mean per analysed step)."""
    if run.missing_ranks or not 1 < len(run) <= CRITICAL_PATH_MAX_RANKS:
        return []
    path = run.critical_path()
    if not len(path):
        return []
    steps = path["step"].nunique()
    per = path.groupby(["rank", "category"], sort=False)["dur"].sum().div(steps)
    per = per.sort_values(ascending=False)
    total = float(per.sum())
    table = pd.DataFrame({
        "rank": per.index.get_level_values(0), "on the path": per.index.get_level_values(1),
        "per step": [fmt_ns(v) for v in per], "share": [fmt_share(v / total) for v in per]})
    return [Section("Critical path across ranks (whose work set each step, mean per step)",
                    table)]


def render_run_report(run: Run, fmt: str) -> str:
    """The run report in one of: text, json, md, html."""
    if fmt == "json":
        return json.dumps(run_report_dict(run), indent=2, default=str)
    return render(f"Neuron Explorer run report: {run.path}", run_report_sections(run), fmt)


def diff_runs(a: Run, b: Run) -> pd.DataFrame:
    """Per rank: step time, compute, communication, exposed and wait time in A and B, and
    B's change in step time. Ranks are matched by number."""
    sa, sb = a.rank_summary().set_index("rank"), b.rank_summary().set_index("rank")
    columns = ["step_time_ns", *_PER_RANK_NS]
    out = sa[columns].add_suffix("_a").join(sb[columns].add_suffix("_b"), how="outer")
    out["step_change"] = out["step_time_ns_b"] / out["step_time_ns_a"] - 1
    return out.reset_index()


def render_run_diff(a: Run, b: Run, fmt: str) -> str:
    """The run diff in one of: text, json, md, html."""
    table = diff_runs(a, b)
    if fmt == "json":
        return json.dumps({"a": a.path, "b": b.path, "ranks": _records(table)}, indent=2,
                          default=str)
    shown = pd.DataFrame({"rank": table["rank"]})
    for column in ("step_time_ns", *_PER_RANK_NS):
        name = column.removesuffix("_ns")
        shown[f"{name} A"] = [fmt_ns(v) for v in table[f"{column}_a"]]
        shown[f"{name} B"] = [fmt_ns(v) for v in table[f"{column}_b"]]
    shown["step change"] = [fmt_share(v) for v in table["step_change"]]
    return render(f"Neuron Explorer run diff: {a.path} -> {b.path}",
                  [Section("Per rank", shown)], fmt)
