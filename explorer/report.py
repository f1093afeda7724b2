"""The report of one trace: headline numbers, breakdown, top ops and modules, findings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.analyses.idle import idle_summary
from neuron_explorer.render import Section, fmt_ns, fmt_share, render

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

TOP = 10


def mean_breakdown(trace: Trace) -> pd.DataFrame:
    """Breakdown averaged over steps: side, category, ns (mean per step), share."""
    bd = trace.breakdown()
    if not len(bd):
        return pd.DataFrame(columns=["side", "category", "ns", "share"])
    g = bd.groupby(["side", "category"], sort=False)[["ns", "share"]].mean().reset_index()
    return g


def report_dict(trace: Trace) -> dict[str, Any]:
    """Everything the report shows, JSON-able."""
    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        return json.loads(frame.to_json(orient="records"))

    return {
        "summary": trace.summary(),
        "breakdown": records(mean_breakdown(trace)),
        "idle": records(idle_summary(trace)),
        "top_ops": records(trace.op_stats().head(TOP)),
        "top_modules": records(trace.module_stats().head(TOP)),
        "top_kernels": records(trace.kernel_stats().head(TOP)),
        "findings": [f.to_dict() for f in trace.bottlenecks()],
    }


def report_sections(trace: Trace) -> list[Section]:
    """The report as titled sections for the text, Markdown and HTML renderers."""
    s = trace.summary()
    head = {
        "trace": s["path"], "format": s["source_format"], "hardware": s["hardware"] or "-",
        "steps": s["n_steps"], "step time (median)": fmt_ns(s["step_time_ns"]),
        "time analysed": fmt_ns(s["total_ns"]), "MFU": fmt_share(s["mfu"]),
        "HFU": fmt_share(s["hfu"]), "MBU": fmt_share(s["mbu"]),
        "device busy": fmt_share(s["device_busy_share"]), "ops": s["n_ops"],
        "kernels": s["n_kernels"],
    }
    if s["skipped"]:
        head["skipped events"] = ", ".join(f"{k}: {v}" for k, v in s["skipped"].items())
    bd = mean_breakdown(trace)
    bd_table = pd.DataFrame({"side": bd["side"], "category": bd["category"],
                             "per step": [fmt_ns(v) for v in bd["ns"]],
                             "share": [fmt_share(v) for v in bd["share"]]})
    idle = idle_summary(trace)
    idle_table = pd.DataFrame({"reason": idle["reason"], "gaps": idle["gaps"],
                               "time": [fmt_ns(v) for v in idle["ns"]],
                               "share": [fmt_share(v) for v in idle["share"]]})
    ops = trace.op_stats().head(TOP)
    ops_table = pd.DataFrame({"op": ops["name"], "count": ops["count"],
                              "device": [fmt_ns(v) for v in ops["device_ns"]],
                              "host": [fmt_ns(v) for v in ops["host_ns"]],
                              "share": [fmt_share(v) for v in ops["share_of_step"]]})
    mods = trace.module_stats().head(TOP)
    mods_table = pd.DataFrame({"module": mods["module"], "phase": mods["phase"],
                               "count": mods["count"],
                               "time": [fmt_ns(v) for v in mods["total_ns"]],
                               "device": [fmt_ns(v) for v in mods["device_ns"]],
                               "share": [fmt_share(v) for v in mods["share_of_step"]]})
    findings = [f"[{f.severity}] {f.title}: {fmt_ns(f.time_lost_ns)} lost "
                f"({fmt_share(f.share_of_step)} of step time). {f.explanation} "
                f"Fix: {f.recommendation}" for f in trace.bottlenecks()]
    return [Section("Summary", head), Section("Step breakdown (mean per step)", bd_table),
            Section("Device idle time by reason", idle_table), Section("Top ops", ops_table),
            Section("Top modules", mods_table),
            Section("Findings (ranked by time lost)", findings or ["no bottleneck found"])]


def render_report(trace: Trace, fmt: str) -> str:
    """The report in one of: text, json, md, html."""
    if fmt == "json":
        return json.dumps(report_dict(trace), indent=2, default=_json_default)
    return render(f"Neuron Explorer report: {trace.path}", report_sections(trace), fmt)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return str(value)
