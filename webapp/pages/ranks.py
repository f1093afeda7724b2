"""Ranks: a distributed run as a whole, for a trace that is one rank of a run folder.

The run is the folder holding the open trace (`view train.run/` serves its ranks):
step time per rank as a heat map, communication overlap and waits per rank, the
ranks' collectives one above the other on one time axis (a call's slices on every
rank linked), and the run's findings.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import dash
from dash import html
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.plot.cards import readable_rank_summary
from neuron_explorer.plot.ranks import collectives_figure, communication_figure, step_times_figure
from neuron_explorer.runs.files import MANIFEST, is_trace_file, rank_from_name
from neuron_explorer.webapp.components import (
    data_table,
    graph,
    metric,
    notice,
    page_title,
    section,
)
from neuron_explorer.webapp.formatting import duration, share

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/ranks"
TITLE = "Ranks"

# (folder, files' sizes and times) -> its Run, or why it does not load as one
_runs: OrderedDict[tuple, Run | NeuronExplorerError] = OrderedDict()
_runs_lock = threading.Lock()
MAX_RUNS = 2


def run_folder(trace: Trace, ctx: AppContext, name: str) -> Path | None:
    """The run folder the trace `name` belongs to: its folder, when that is a run folder (it
    has a run manifest, or two or more of its files are named for ranks); None otherwise."""
    try:
        path = ctx.store.resolve(name)
    except (NeuronExplorerError, AttributeError, OSError):
        return None
    folder = path.parent
    traces = [p for p in folder.iterdir() if p.is_file() and is_trace_file(p.name)]
    if len(traces) < 2:
        return None
    ranked = [p for p in traces if rank_from_name(str(p)) is not None]
    if (folder / MANIFEST).exists() or len(ranked) >= 2:
        return folder
    return None


def load_folder(folder: Path) -> Run:
    """The run of a folder, loaded once while its files stay as they are; a folder that
    does not load as one run (two traces of one rank, say) raises its error again without
    loading every rank anew."""
    from neuron_explorer.runs.run import load_run

    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()
                   if p.is_file())
    key = (str(folder), tuple(files))
    with _runs_lock:
        found = _runs.get(key)
        if found is not None:
            _runs.move_to_end(key)
    if found is None:
        try:
            found = load_run(folder, progress=False)
        except NeuronExplorerError as exc:
            found = exc
        with _runs_lock:
            _runs[key] = found
            while len(_runs) > MAX_RUNS:
                _runs.popitem(last=False)
    if isinstance(found, NeuronExplorerError):
        raise found.with_traceback(None)
    return found


def slowest_step_ns(run: Run) -> float | None:
    """The largest of the ranks' median step times (None when no rank has steps)."""
    medians = run.rank_summary()["step_time_ns"].dropna()
    return float(medians.max()) if len(medians) else None


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    folder = run_folder(trace, ctx, name)
    if folder is None:
        return html.Div([page_title(TITLE, name), section("Ranks", notice(
            "This trace is a single process. The Ranks page shows a distributed run: open a "
            "rank of a run folder (`neuron-explorer record -- torchrun ...` writes one, or "
            "serve a folder of per-rank PyTorch-profiler traces with `neuron-explorer view "
            "FOLDER`).", "info"))])
    try:
        run = load_folder(folder)
    except NeuronExplorerError as exc:
        return html.Div([page_title(TITLE, name), section("Ranks", notice(
            f"The traces in {folder.name}/ do not load as one run: {exc}", "warning"))])
    late = run.stragglers()
    comm = run.communication()
    communicating = float(comm["communication_ns"].sum()) if len(comm) else 0.0
    overlapped = share(comm["overlap_ns"].sum() / communicating) if communicating else "-"
    missing = run.missing_ranks
    partial = notice(
        f"This run holds {len(run)} of its {run.world_size} ranks: the other {len(missing)} "
        "are not here, so their arrivals at collectives and their work are unknown. No rank "
        "is called a straggler and no wait or imbalance is judged across ranks; the "
        "figures below are those of the ranks present.", "warning") if missing else None
    cards = html.Div([
        metric("ranks", f"{len(run)} of {run.world_size}" if missing else str(len(run))),
        # every rank waits for the slowest at each collective: its median step is the run's pace
        metric("step time", duration(slowest_step_ns(run)), "median per step, slowest rank"),
        metric("time analysed", duration(run.analysed_time_ns()), "mean over ranks"),
        metric("communication overlapped", overlapped),
        metric("stragglers", ", ".join(f"rank {r}" for r in late["rank"]) or "none"),
    ], className="metrics")
    findings = run.bottlenecks()
    finding_items = [html.Li([html.Strong(f"[{f.severity}] {f.title}"), f" — {f.explanation} ",
                              html.Em(f"Fix: {f.recommendation}")]) for f in findings[:8]]
    return html.Div([
        page_title(TITLE, f"{folder.name}: {len(run)} ranks"),
        *([partial] if partial is not None else []),
        cards,
        section("Step time per rank", graph(step_times_figure(run), "ranks-steps"),
                subtitle="Each cell one step of one rank; a slow rank shows as a row"),
        section("Communication per rank", graph(communication_figure(run), "ranks-comm"),
                subtitle="Time each rank's devices communicate: hidden under compute, moving "
                         "data with nothing else to do, and waiting for the last rank"),
        section("Collectives across ranks", graph(collectives_figure(run), "ranks-aligned"),
                subtitle="One row per rank on one time axis: red is waiting for the last rank, "
                         "blue moving data; grey lines join one call on every rank"),
        section("Findings", html.Ul(finding_items) if finding_items
                else notice("No cross-rank bottleneck found.", "info")),
        section("Per rank", data_table(readable_rank_summary(run), "ranks-table", page_size=16)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> None:
    """No callbacks: the run's figures are static."""
