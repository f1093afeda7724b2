"""The report of one trace: headline numbers, breakdown, top ops and modules, findings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.analyses.compilation import compiled_what
from neuron_explorer.analyses.idle import idle_summary
from neuron_explorer.analyses.levels import (
    modelled_host_clock,
    not_recorded,
    recorded_level,
    records_device,
)
from neuron_explorer.analyses.phases import phase_summary, split_phases, without_cache
from neuron_explorer.analyses.requests import marked_requests, request_percentiles
from neuron_explorer.analyses.startup import STARTUP_MIN_NS, before_first_kernel, startup_gaps
from neuron_explorer.analyses.steady_state import (
    analysed_steps,
    compiling_steps,
    in_analysed_steps,
)
from neuron_explorer.analyses.summary import mean_step_apart, summary_device_paced
from neuron_explorer.common import trace_format as tf
from neuron_explorer.kernel_report import kernel_dict, kernel_sections
from neuron_explorer.render import Section, fmt_ns, fmt_share, render
from neuron_explorer.rules import ran_nothing
from neuron_explorer.rules.finding import sections as findings_sections
from neuron_explorer.units import size
from neuron_explorer.what_if.label import prediction_text

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

TOP = 10
# findings whose share is of the whole recorded run, not of the analysed steps


def mean_breakdown(trace: Trace) -> pd.DataFrame:
    """Breakdown averaged over the analysed steps (the steady state): side, category, ns
    (mean per step), share."""
    bd = trace.breakdown()
    if not len(bd):
        return pd.DataFrame(columns=["side", "category", "ns", "share"])
    g = bd.groupby(["side", "category"], sort=False)["ns"].mean().reset_index()
    # the share of the mean step, so it adds up with the times beside it (a mean of per-step
    # shares would weigh a short step like a long one)
    side_total = g.groupby("side", sort=False)["ns"].transform("sum")
    g["share"] = (g["ns"] / side_total.where(side_total > 0)).fillna(0.0)
    return g


def report_dict(trace: Trace) -> dict[str, Any]:
    """Everything the report shows, JSON-able."""
    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        return json.loads(frame.to_json(orient="records"))

    return {
        "summary": trace.summary(),
        "breakdown": records(mean_breakdown(trace)),
        "critical_path": records(trace.critical_path()),
        "idle": records(idle_summary(trace)),
        "top_ops": records(trace.op_stats().head(TOP)),
        "top_modules": records(trace.module_stats().head(TOP)),
        "top_kernels": records(trace.kernel_stats().head(TOP)),
        "findings": [f.to_dict() for f in trace.bottlenecks()],
        "kernels": kernel_dict(trace),
        "phases": records(phase_summary(trace)),
        "serving": records(trace.serving()),
        # per request only where marked: unmarked rows of a batch share their generation's
        "requests": records(trace.requests()) if marked_requests(trace) else [],
        "request_percentiles": records(request_percentiles(trace.requests()))
        if marked_requests(trace) else [],
    }


def _host_windows_text(s: dict[str, Any]) -> str:
    """The host's step windows, where the device paces the run instead."""
    if not summary_device_paced(s):
        return ""
    host, paced = s["host_step_ns"], s["device_paced_step_ns"]
    return (f"{fmt_ns(host)}: the device needs {fmt_ns(paced - host)} a step more than its "
            "host and nothing in a step waits for it, so it falls further behind every "
            "step and sets the run's pace (the step time, MFU, MBU and the findings' shares "
            "are the device's; the breakdown and critical path read the host's windows)")


def _mean_step_text(s: dict[str, Any]) -> str:
    """The analysed steps' mean, where it is far from their median."""
    mean = mean_step_apart(s)
    if mean is None:
        return ""
    return (f"{fmt_ns(mean)} (the steps' lengths vary: a finding's time a step is of this "
            "mean, its total over the analysed steps)")


# what a modelled host clock leaves out, said where its figures are read
MODELLED_CLOCK = ("modelled (the ops' modelled costs only: data loading, sleeps, I/O, "
                  "Python work between ops and compiling count nothing; record without "
                  "NEURON_HOST_CLOCK=modelled to see them)")


def _program_ended_text(trace: Trace) -> str:
    """How the recorded program ended where it did not end well ("" otherwise): a crashed
    run's report read as a run's, with its set-up as its only step."""
    code = trace.metadata.get(tf.META_EXIT_CODE)
    if not code:
        return ""
    error = trace.metadata.get(tf.META_PROGRAM_ERROR)
    return (f"exited with code {code}" + (f": {error}" if error else "")
            + "; the trace holds what ran until then")


def report_sections(trace: Trace) -> list[Section]:
    """The report as titled sections for the text, Markdown and HTML renderers."""
    s = trace.summary()
    device = records_device(trace)
    missing = not_recorded(trace)

    def device_share(value: Any) -> str:
        return _small_share(value) if device else missing

    head = {
        "trace": s["path"], "format": s["source_format"], "hardware": s["hardware"] or "-",
        **({"program": ended} if (ended := _program_ended_text(trace)) else {}),
        **({"host clock": MODELLED_CLOCK} if modelled_host_clock(trace) else {}),
        "steps": s["n_steps"], "steps analysed": s["steps_analysed_text"],
        "step time (median)": fmt_ns(s["step_time_ns"])
        + (" (the device's pace)" if summary_device_paced(s) else ""),
        **({"step time (mean)": mean} if (mean := _mean_step_text(s)) else {}),
        **({"host's step windows": host} if (host := _host_windows_text(s)) else {}),
        "time analysed": fmt_ns(s["total_ns"]), "MFU": device_share(s["mfu"]),
        "HFU": device_share(s["hfu"]), "MBU": device_share(s["mbu"]),
        "device busy": device_share(s["device_busy_share"]),
        "ops": s["n_ops"] if device or recorded_level(trace) is None else missing,
        "kernels": s["n_kernels"] if device else missing,
    }
    if set(phase_summary(trace)["phase"]) - {"train"}:  # a plain training run: no line
        head["phases"] = _phases_text(trace)
    if prediction_text(trace):
        head["prediction"] = prediction_text(trace)
    if s["compile_ns"]:
        head["compile (on its own)"] = _compile_text(trace)
    startup, first = startup_gaps(trace), before_first_kernel(trace)
    if len(startup) or first >= STARTUP_MIN_NS:
        head["start-up (once)"] = _startup_text(startup, first)
    if s["skipped"]:
        head["skipped events"] = ", ".join(f"{k}: {v}" for k, v in s["skipped"].items())
    bd = mean_breakdown(trace)
    per = "per step" if s["steps_analysed"] else "time"  # no step marks: the whole trace
    bd_table = pd.DataFrame({"side": bd["side"], "category": bd["category"],
                             per: [fmt_ns(v) for v in bd["ns"]],
                             "share": [fmt_share(v) for v in bd["share"]]})
    idle = idle_summary(trace)
    idle_table = pd.DataFrame({"reason": idle["reason"], "gaps": idle["gaps"],
                               "time": [fmt_ns(v) for v in idle["ns"]],
                               "share": [fmt_share(v) for v in idle["share"]]})
    ops = trace.op_stats().head(TOP)
    ops_table: pd.DataFrame | list[str] = pd.DataFrame({
        "op": ops["name"], "count": ops["count"],
        "device": [fmt_ns(v) for v in ops["device_ns"]],
        "host": [fmt_ns(v) for v in ops["host_ns"]],
        "share": [fmt_share(v) for v in ops["share_of_step"]]})
    if not len(ops) and len(trace.ops):  # the summary counts every op of the trace
        ops_table = [_no_ops_counted(trace)]
    mods = trace.module_stats().head(TOP)
    mods_table = pd.DataFrame({"module": mods["module"], "phase": mods["phase"],
                               "count": mods["count"],
                               "time": [fmt_ns(v) for v in mods["total_ns"]],
                               "device": [fmt_ns(v) for v in mods["device_ns"]],
                               "share": [fmt_share(v) for v in mods["share_of_step"]]})
    findings, unseen = list(trace.bottlenecks()), []
    if ran_nothing(trace):
        code = trace.metadata.get("exit_code")
        unseen.append("findings: the analysed steps ran for 0 ns"
                      + (f" (the program exited with code {code} before any step ran work)"
                         if code else "") + ": no cause to weigh")
    ours = recorded_level(trace) is not None
    if not device:
        unseen.append(f"findings about the device (launches, kernels, memory): {missing}"
                        + ("; record with --level op or engine to get them" if ours else ""))
    elif recorded_level(trace) == "op":
        unseen.append("findings about engines and DMA transfers: not recorded at --level op; "
                        "record with --level engine to get them")
    if not device:
        bd_table = pd.concat([bd_table, pd.DataFrame([{"side": "device", "category": missing,
                                                       per: "-", "share": "-"}])])
        idle_table = [f"device idle time: {missing}"]
        if ours:
            ops_table = [f"ops: {missing}"]
        mods_table = mods_table.drop(columns=["device"])
    return [Section("Summary", head),
            *([Section("Phases (every recorded step of each; busy, MFU, MBU and tokens/s over its "
                       "steps' host or device time, whichever is longer)",
                       phases)] if len(phases := _phases_table(trace)) else []),
            Section(_breakdown_title(s), bd_table),
            Section(_critical_title(s), _critical_table(trace)),
            Section("Device idle time by reason", idle_table),
            *([Section("Queues and launches (per stream, the whole trace)", queues)]
              if device and len(queues := _queues_table(trace)) else []),
            *([Section("Counters (the whole trace)", counters)]
              if len(counters := _counters_table(trace)) else []),
            *([Section("CUPTI counters per op (the profiled kernels)", cupti)]
              if len(cupti := _cupti_table(trace)) else []),
            *([Section(_serving_title(trace), serving)]
              if len(serving := _serving_table(trace)) else []),
            *([Section(_requests_title(trace), requests)]
              if len(requests := _requests_table(trace)) else []),
            *([Section("Annotated regions (device time, the whole trace)", regions)]
              if device and len(regions := _regions_table(trace)) else []),
            *([Section("Frequent kernel sequences (3 kernels, the whole trace)", sequences)]
              if device and len(sequences := _sequences_table(trace)) else []),
            Section("Top ops", ops_table),
            Section("Top modules", mods_table), *kernel_sections(trace),
            *findings_sections(findings, unseen)]


def _phases_text(trace: Trace) -> str:
    """'train: 9 steps, 3.3 ms median; eval: 12 passes, 0.9 ms median (not in the
    per-step figures)' from the phase summary."""
    ps = phase_summary(trace)
    split = split_phases(trace)
    parts = []
    for row in ps.itertuples(index=False):
        noun = "pass" if row.phase == "eval" else "step"
        unit = noun if row.steps == 1 else noun + ("es" if row.phase == "eval" else "s")
        text = f"{row.phase}: {row.steps} {unit}, {fmt_ns(row.median_ns)} median"
        if split and row.phase != "train":
            text += " (not in the per-step figures)"
        parts.append(text)
    return "; ".join(parts)


def _serving_table(trace: Trace) -> pd.DataFrame:
    """Per generation: time to first token, time per output token, tokens/s."""
    sv = trace.serving()
    if not len(sv):
        return pd.DataFrame()

    def shown(values: pd.Series, form: Any = "{:.0f}".format) -> list[str]:
        return ["-" if pd.isna(v) else form(v) for v in values]  # unknown: token ids unseen

    return pd.DataFrame({"step": sv["step"], "batch": shown(sv["batch"]),
                         "prompt tokens": shown(sv["prompt_tokens"]),
                         "decode steps": sv["decode_steps"],
                         "new tokens": shown(sv["new_tokens"]),
                         "time to first token": shown(sv["ttft_ns"], fmt_ns),
                         "per output token (median)": shown(sv["tpot_median_ns"], fmt_ns),
                         "per output token (p90)": shown(sv["tpot_p90_ns"], fmt_ns),
                         "tokens/s": shown(sv["tokens_per_s"]),
                         # what bounds each part: compute for the prompt, bytes per token
                         "prefill MFU": shown(sv["prefill_mfu"], _small_share),
                         "decode MBU": shown(sv["decode_mbu"], _small_share),
                         "KV cache": _without_cache(sv, shown(sv["kv_bytes"], size)),
                         "KV per token": _without_cache(sv, shown(sv["kv_bytes_per_token"],
                                                                  size))})


def _without_cache(sv: pd.DataFrame, shown: list[str]) -> list[str]:
    """'none' for the generations that read no KV cache (each call feeds the whole
    sequence), where '-' would say the figure is unknown."""
    return ["none" if without_cache(c) else v for c, v in zip(sv["kv_cache"], shown,
                                                               strict=True)]


def _phases_table(trace: Trace) -> pd.DataFrame:
    """Each phase's own figures (an eval pass's, a prefill's apart from the training or
    decode steps'); none for a plain training run, whose figures are the report's."""
    ps = phase_summary(trace)
    if not set(ps["phase"]) - {"train"}:
        return pd.DataFrame()
    busy = ps["device_ns"] / ps["paced_ns"].where(ps["paced_ns"] > 0)

    def shown(values: pd.Series, form: Any) -> list[str]:
        return ["-" if pd.isna(v) else form(v) for v in values]

    return pd.DataFrame({"phase": ps["phase"], "steps": ps["steps"],
                         "median": shown(ps["median_ns"], fmt_ns),
                         "total": shown(ps["total_ns"], fmt_ns),
                         "device": shown(ps["device_ns"], fmt_ns),
                         "device busy": shown(busy, fmt_share),
                         "MFU": shown(ps["mfu"], _small_share),
                         "MBU": shown(ps["mbu"], _small_share),
                         "tokens/s": shown(ps["tokens_per_s"], "{:.0f}".format)})


def _serving_title(trace: Trace) -> str:
    if marked_requests(trace):
        return "Serving (the marked requests pooled, first prefill to last token)"
    return "Generation (per prefill and its decode steps)"


def _requests_title(trace: Trace) -> str:
    n = len(marked_requests(trace))
    return f"Requests ({n} marked; percentiles over requests)"


def _requests_table(trace: Trace) -> pd.DataFrame:
    """Percentiles over the marked requests of queueing, time to first token, time per
    output token and end-to-end latency (none without marks: a batch's unmarked rows share
    their figures)."""
    if not marked_requests(trace):
        return pd.DataFrame()
    pct = request_percentiles(trace.requests())
    return pd.DataFrame({"figure": pct["figure"], "requests": pct["requests"],
                         **{c: pct[c].map(fmt_ns) for c in pct.columns[2:]}})


def _small_share(value: Any) -> str:
    """A share that a toy model makes tiny: two significant digits, not "0.0%"."""
    if isinstance(value, float) and 0 < value < 0.0005:
        return f"{100 * value:.2g}%"
    return fmt_share(value)


def _queues_table(trace: Trace) -> pd.DataFrame:
    """Per stream: its launches and HTA's launch groups (short kernels, delayed ones),
    the median launch delay, how deep its queue ran (max, time-weighted mean, the share
    of time it was empty) and its idle time between kernels in HTA's categories."""
    from neuron_explorer.analyses.launch_stats import launch_outliers

    queues = trace.queue_length_summary().set_index("stream")
    stats = trace.launch_stats()
    if not len(queues) or not len(stats):
        return pd.DataFrame()
    groups = {name: rows.groupby("stream").size() for name, rows in launch_outliers(stats).items()}
    per = stats.groupby("stream")
    launches, delay = per.size(), per["launch_delay_ns"].median()
    idle = trace.stream_idle().pivot_table(index="stream", columns="idle_category",
                                           values="idle_ns", aggfunc="sum")
    rows = [{"stream": stream, "launches": int(launches.get(stream, 0)),
             "short kernels": int(groups["short"].get(stream, 0)),
             "delayed > 100 us": int(groups["delayed"].get(stream, 0)),
             "launch delay (median)": fmt_ns(delay.get(stream, 0)),
             "queue max": int(q["max"]), "queue mean": f"{q['time_weighted_mean']:.2f}",
             "empty": fmt_share(q["empty_share"]),
             **{f"idle: {name}": fmt_ns(idle.at[stream, name] if stream in idle.index else 0)
                for name in ("host_wait", "kernel_wait", "other")}}
            for stream, q in queues.iterrows()]
    return pd.DataFrame(rows)


REPORT_ROWS = 8  # rows of the regions' and sequences' tables


def _regions_table(trace: Trace) -> pd.DataFrame:
    """The annotated regions (`record_function`) with the most device time."""
    regions = trace.annotations()
    regions = regions[regions["device_total_ns"] > 0]
    if not len(regions):
        return pd.DataFrame()
    top = regions.sort_values("device_total_ns", ascending=False).head(REPORT_ROWS)
    # the name and its depth: whole paths run past the column's width
    return pd.DataFrame({"region": top["name"].map(lambda n: _short(str(n), 50)),
                         "depth": top["depth"],
                         "count": top["count"], "host": top["host_ns"].map(fmt_ns),
                         "device": top["device_total_ns"].map(fmt_ns),
                         "share": top["device_total_ns"].map(
                             lambda v: fmt_share(v / max(float(trace.kernels["dur"].sum()), 1)))})


def _sequences_table(trace: Trace) -> pd.DataFrame:
    """The sequences of three kernels that repeat most (fusion candidates), with their
    time; only those seen more than once. On our device, also each occurrence's kernel
    time and its ops' as one compiled program (`compiled_times`)."""
    from neuron_explorer.analyses.kernel_sequences import compiled_times

    sequences = trace.kernel_sequences(3)
    sequences = sequences[sequences["count"] > 1].head(REPORT_ROWS)
    if not len(sequences):
        return pd.DataFrame()
    # each kernel's name cut short, so that all three show
    short = sequences["sequence"].map(
        lambda q: " | ".join(_short(part, 18) for part in str(q).split(" | ")))
    table = pd.DataFrame({"sequence": short,
                          "count": sequences["count"],
                          "time": sequences["total_ns"].map(fmt_ns),
                          "share": sequences["share"].map(fmt_share)})
    compiled = pd.Series(compiled_times(trace, sequences["sequence"].tolist(), 3),
                         index=sequences.index)
    if compiled.notna().any():
        table["each"] = sequences["mean_ns"].map(fmt_ns)
        table["compiled"] = compiled.map(lambda ns: "n/a" if pd.isna(ns) else fmt_ns(ns))
    return table


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _counters_table(trace: Trace) -> pd.DataFrame:
    """Per counter series: its samples, mean over time, max and last value (the CUPTI
    counters are per op in a section of their own)."""
    summary = trace.counter_summary()
    summary = summary[~summary["series"].isin(trace.cupti_counters().columns)]
    if not len(summary):
        return pd.DataFrame()
    return pd.DataFrame({"series": summary["series"],
                         "device": summary["device"].map(lambda d: "host" if d < 0 else d),
                         "samples": summary["samples"],
                         "mean over time": summary["time_weighted_mean"].map("{:.4g}".format),
                         "max": summary["max"].map("{:.4g}".format),
                         "last": summary["last"].map("{:.4g}".format)})


def _cupti_table(trace: Trace) -> pd.DataFrame:
    """Per innermost op around the profiled kernels' launches: the kernels, the ops they
    ran under, and the FLOPs their SASS instruction counters give, most first."""
    kernels = trace.cupti_counters()
    if not len(kernels):
        return pd.DataFrame()
    per = kernels.groupby(kernels["bottom_level_op"].replace("", "(no op)"), sort=False)
    table = pd.DataFrame({
        "kernels": per.size(),
        "under": per["top_level_op"].agg(lambda ops: ", ".join(sorted(set(ops) - {""}))),
        "flops": per["flops"].sum(min_count=1)})
    total = table["flops"].sum()
    table = table.sort_values(["flops", "kernels"], ascending=False, na_position="last")
    return pd.DataFrame({
        "op": table.index, "kernels": table["kernels"].to_numpy(),
        "under": table["under"].to_numpy(),
        "FLOPs": table["flops"].map(lambda f: "n/a" if pd.isna(f) else f"{f:.4g}").to_numpy(),
        "share": (table["flops"] / total).map(
            lambda f: "n/a" if pd.isna(f) else f"{f:.1%}").to_numpy()
        if total > 0 else "n/a"})


def _no_ops_counted(trace: Trace) -> str:
    """Why a trace with ops has none in its statistics: where its ops are."""
    inside = len(in_analysed_steps(trace, trace.ops))
    if not inside:
        return f"none in the analysed steps (the trace's {len(trace.ops)} ops lie outside them)"
    return (f"none counted: the {inside} ops in the analysed steps run in eval passes, which "
            "the statistics leave out")


def _critical_title(s: dict[str, Any]) -> str:
    where = _steps_label(s) if s["steps_analysed"] else "the whole trace"
    if summary_device_paced(s):  # the host's windows are not what paces the run
        return (f"Critical path (of the host's step windows, mean per step, {where}; the "
                "device paces the run: see the step time)")
    return f"Critical path (what sets the step's length, mean per step, {where})"


def _critical_table(trace: Trace) -> pd.DataFrame | list[str]:
    """The critical path's time per kind and category, as a mean per analysed step."""
    path = trace.critical_path()
    if not len(path):
        return ["no steps to walk"]
    steps = path["step"].nunique()
    per = path.groupby(["kind", "category"], sort=False)["dur"].sum() / steps
    per = per.sort_values(ascending=False)
    total = float(per.sum())
    return pd.DataFrame({"side": [k for k, _ in per.index],
                         "on the path": [c for _, c in per.index],
                         "per step": [fmt_ns(v) for v in per],
                         "share": [fmt_share(v / total if total else 0) for v in per]})


def _breakdown_title(s: dict[str, Any]) -> str:
    if not s["steps_analysed"]:  # the whole trace counts as one step
        return "Time breakdown (the whole trace: it has no step marks)"
    return f"Step breakdown (mean per analysed step, {_steps_label(s)})"


def _steps_label(s: dict[str, Any]) -> str:
    """'steps 1–5' from the summary's words 'steps 1–5 of 0–5 (...)'."""
    return str(s["steps_analysed_text"]).split(" of ")[0]


def _startup_text(startup: pd.DataFrame, first_ns: int) -> str:
    """The one-time start-up in words: the time before the device's first work, the gaps
    before first launches, and the longest with the call that paid it."""
    parts = [f"{fmt_ns(first_ns)} before the device's first work"] \
        if first_ns >= STARTUP_MIN_NS else []
    if len(startup):
        longest = startup.sort_values("dur", ascending=False).iloc[0]
        by = f" in {longest['op']}" if longest["op"] else ""
        launches = f"{len(startup)} first launch{'es' * (len(startup) > 1)}"
        longest_text = (f"; the longest {fmt_ns(longest['dur'])}" if len(startup) > 1
                        else ",")
        parts.append(f"{fmt_ns(startup['dur'].sum())} of device idle before {launches} "
                     f"(not in the findings){longest_text}{by}, before "
                     f"{str(longest['kernel'])[:60]}")
    return "; ".join(parts)


def _compile_text(trace: Trace) -> str:
    """Compile time, graphs and the steps it ran in, apart from the per-step figures."""
    cs = trace.compile_summary()
    totals = cs["totals"].iloc[0]
    # every step that compiled: graphs, recompiles, and a dynamic graph's new sizes
    steps = sorted(compiling_steps(trace))
    analysed = set(analysed_steps(trace).steps)
    where = f"in step {', '.join(map(str, steps))}" if steps else "outside the steps"
    inside = " (inside the analysed steps)" if analysed & set(steps) else \
        " (not in the per-step figures)"
    parts = [f"{fmt_ns(totals['compile_ns'])} in {compiled_what(totals)}, {where}{inside}"]
    if totals["recompiles"]:
        parts.append(f"{int(totals['recompiles'])} recompiles")
    if totals["graph_breaks"]:
        parts.append(f"{int(totals['graph_breaks'])} graph breaks")
    return "; ".join(parts)


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
