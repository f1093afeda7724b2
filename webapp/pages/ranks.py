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
from typing import Any

import pandas as pd
from dash import html
from neuron_explorer.analyses.ranks import step_collectives
from neuron_explorer.errors import NeuronExplorerError
from neuron_explorer.run_files import MANIFEST, is_trace_file, rank_from_name
from neuron_explorer.webapp.components import (
    data_table,
    graph,
    metric,
    notice,
    page_title,
    section,
)
from neuron_explorer.webapp.formatting import duration, share
from neuron_explorer.webapp.timeline_figure import time_ticks

PATH = "/ranks"
TITLE = "Ranks"
WAIT_COLOUR, TRANSFER_COLOUR, LINK_COLOUR = "#d9534f", "#4a7bd0", "rgba(90, 90, 90, 0.35)"
MAX_LINKED_CALLS = 200  # calls drawn on the aligned timeline: enough to read, fast to send

_runs: OrderedDict[tuple, Any] = OrderedDict()  # (folder, files' sizes and times) -> Run
_runs_lock = threading.Lock()
MAX_RUNS = 2


def run_folder(trace: Any, ctx: Any, name: str) -> Path | None:
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


def load_folder(folder: Path) -> Any:
    """The run of a folder, loaded once while its files stay as they are."""
    from neuron_explorer.run import load_run

    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()
                   if p.is_file())
    key = (str(folder), tuple(files))
    with _runs_lock:
        if key in _runs:
            _runs.move_to_end(key)
            return _runs[key]
    run = load_run(folder, progress=False)
    with _runs_lock:
        _runs[key] = run
        while len(_runs) > MAX_RUNS:
            _runs.popitem(last=False)
    return run


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
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
    cards = html.Div([
        metric("ranks", str(len(run))),
        metric("step time per rank", duration(run.step_time_ns()), "total of the analysed steps"),
        metric("communication overlapped", overlapped),
        metric("stragglers", ", ".join(f"rank {r}" for r in late["rank"]) or "none"),
    ], className="metrics")
    findings = run.bottlenecks()
    finding_items = [html.Li([html.Strong(f"[{f.severity}] {f.title}"), f" — {f.explanation} ",
                              html.Em(f"Fix: {f.recommendation}")]) for f in findings[:8]]
    return html.Div([
        page_title(TITLE, f"{folder.name}: {len(run)} ranks"),
        cards,
        section("Step time per rank", graph(step_heatmap(run), "ranks-steps", height=320),
                subtitle="Each cell one step of one rank; a slow rank shows as a row"),
        section("Communication per rank", graph(communication_bars(run), "ranks-comm",
                                                height=320),
                subtitle="Time each rank's devices communicate: hidden under compute, moving "
                         "data with nothing else to do, and waiting for the last rank"),
        section("Collectives across ranks", graph(aligned_collectives(run), "ranks-aligned",
                                                  height=120 + 40 * len(run)),
                subtitle="One row per rank on one time axis: red is waiting for the last rank, "
                         "blue moving data; grey lines join one call on every rank"),
        section("Findings", html.Ul(finding_items) if finding_items
                else notice("No cross-rank bottleneck found.", "info")),
        section("Per rank", data_table(_rank_table(run), "ranks-table", page_size=16)),
    ])


def step_heatmap(run: Any) -> dict:
    st = run.step_times()
    return {"data": [{
        "type": "heatmap", "z": (st.to_numpy() / 1e6).tolist(),
        "x": [str(c) for c in st.columns], "y": [f"rank {r}" for r in st.index],
        "colorscale": "Blues", "colorbar": {"title": {"text": "ms"}},
        "hovertemplate": "%{y}, step %{x}: %{z:.3f} ms<extra></extra>",
    }], "layout": {"xaxis": {"title": {"text": "step"}, "type": "category"},
                   "yaxis": {"autorange": "reversed"}}}


def communication_bars(run: Any) -> dict:
    comm = run.communication().groupby("rank")[["overlap_ns", "exposed_transfer_ns"]].sum()
    coll = step_collectives(run)
    wait = coll.groupby("rank")["wait_ns"].sum() if len(coll) else pd.Series(dtype=float)
    ranks = [f"rank {r}" for r in comm.index]
    bars = [("overlapped with compute", comm["overlap_ns"], "#5cb85c"),
            ("moving data, not hidden", comm["exposed_transfer_ns"], TRANSFER_COLOUR),
            ("waiting for the last rank", wait.reindex(comm.index).fillna(0), WAIT_COLOUR)]
    return {"data": [{"type": "bar", "name": label, "x": ranks, "y": (values / 1e6).tolist(),
                      "marker": {"color": colour},
                      "hovertemplate": f"%{{x}} {label}: %{{y:.3f}} ms<extra></extra>"}
                     for label, values, colour in bars],
            "layout": {"barmode": "group", "yaxis": {"title": {"text": "ms"}},
                       "legend": {"orientation": "h", "y": 1.15}}}


def aligned_collectives(run: Any) -> dict:
    """Each rank's collectives in the first calls of the run, wait and transfer apart,
    with a line through each call's arrivals on every rank."""
    coll = step_collectives(run)
    if not len(coll):
        return {"data": [], "layout": {"annotations": [{"text": "no collectives in this run",
                                                        "showarrow": False}]}}
    first_calls = coll.drop_duplicates(["group", "collective", "seq"]).sort_values("arrival")
    shown = first_calls.head(MAX_LINKED_CALLS)[["group", "collective", "seq"]]
    calls = coll.merge(shown, on=["group", "collective", "seq"])
    origin = int(calls["arrival"].min())
    end = int((calls["ts"] + calls["dur"]).max())
    y = {r: i for i, r in enumerate(run.ranks)}
    wait = calls["wait_ns"].clip(lower=0)
    start = calls["last_arrival"].where(calls["wait_ns"] > 0, calls["arrival"])
    data = [
        _bars(calls["arrival"], wait, calls["rank"].map(y), origin, WAIT_COLOUR,
              "waiting", calls),
        _bars(start, calls["ts"] + calls["dur"] - start, calls["rank"].map(y), origin,
              TRANSFER_COLOUR, "moving data", calls),
    ]
    xs: list[float | None] = []
    ys: list[float | None] = []
    for _, rows in calls.sort_values("rank").groupby(["group", "collective", "seq"]):
        if len(rows) > 1:
            xs += ((rows["arrival"] - origin) / 1e3).tolist() + [None]
            ys += rows["rank"].map(y).tolist() + [None]
    data.append({"type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": "same call",
                 "line": {"color": LINK_COLOUR, "width": 1}, "hoverinfo": "skip"})
    return {"data": data, "layout": {
        "barmode": "overlay", "bargap": 0.35,
        "xaxis": {"title": {"text": "time since the first call"}, **time_ticks(origin, end, origin)},
        "yaxis": {"tickvals": list(y.values()), "ticktext": [f"rank {r}" for r in y],
                  "autorange": "reversed"},
        "legend": {"orientation": "h", "y": 1.2}}}


def _bars(start: pd.Series, length: pd.Series, row: pd.Series, origin: int, colour: str,
          label: str, calls: pd.DataFrame) -> dict:
    text = [f"rank {r}: {c} #{s}, {b / 2**20:.2f} MiB, {label} {duration(n)}"
            for r, c, s, b, n in zip(calls["rank"], calls["collective"], calls["seq"],
                                     calls["bytes"], length, strict=True)]
    return {"type": "bar", "orientation": "h", "name": label, "y": row.tolist(),
            "x": (length / 1e3).tolist(), "base": ((start - origin) / 1e3).tolist(),
            "marker": {"color": colour}, "hovertext": text, "hoverinfo": "text", "width": 0.6}


def _rank_table(run: Any) -> pd.DataFrame:
    table = run.rank_summary()
    out = pd.DataFrame({"rank": table["rank"], "trace": table["path"], "steps": table["steps"]})
    for column in ("step_time_ns", "compute_ns", "communication_ns", "exposed_ns", "wait_ns",
                   "wait_caused_ns"):
        out[column.removesuffix("_ns").replace("_", " ")] = [duration(v) for v in table[column]]
    return out


def register(app, ctx) -> None:
    """No callbacks: the run's figures are static."""
