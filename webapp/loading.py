"""Loading a trace in the background, and the page that shows its progress meanwhile.

A big trace takes seconds to load. The dashboard answers at once: a page asked for a
trace not loaded yet starts the load on a thread of its own and shows a progress bar
fed by the loader's own progress (`neuron_explorer.progress.observe`: the bars the
loader opens, e.g. one per rank of a run), with the time so far; when the load is done
the page is drawn, and when it fails the error is shown as for any bad trace.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import dash
from dash import Input, Output, State, dcc, html
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.load_progress import LoadProgress

if TYPE_CHECKING:
    from neuron_explorer.webapp.context import AppContext

POLL_MS = 300  # how often the loading page asks for progress
SHOW_AFTER_S = 0.5  # a load done within this shows no loading page at all


def loading_layout(name: str, progress: LoadProgress) -> html.Div:
    """The page shown while `name` loads: its progress bar, polled until the load ends."""
    return html.Div([
        html.H2(f"Loading {name}", className="page-title"),
        html.Div(html.Div(id="loading-fill", style=_fill_style(progress),
                          className="loading-fill" + ("" if progress.fraction() is not None
                                                      else " indeterminate")),
                 id="loading-bar", className="loading-track", role="progressbar"),
        html.P(status_text(progress), id="loading-text", className="loading-text"),
        dcc.Store(id="loading-name", data=name),
        dcc.Interval(id="loading-tick", interval=POLL_MS),
    ], className="loading-page")


def status_text(progress: LoadProgress) -> str:
    what = progress.what or f"loading {progress.name}"
    parts = [what, fmt.size(progress.size_bytes)]
    if progress.total > 1:
        parts.append(f"{progress.done} of {progress.total}")
    parts.append(f"{progress.elapsed_s():.1f} s")
    return " · ".join(parts)


def _fill_style(progress: LoadProgress) -> dict[str, str]:
    share = progress.fraction()
    if share is None:  # the loader cannot say how far it is: a moving bar, honest about it
        return {"width": "30%"}
    return {"width": f"{share:.0%}"}


def register(app: dash.Dash, ctx: AppContext) -> None:
    """The loading page's poll: move the bar; when the load ends, have the page drawn."""

    @app.callback(
        Output("loading-fill", "style"),
        Output("loading-fill", "className"),
        Output("loading-text", "children"),
        Output("loading-tick", "disabled"),
        Output("loaded-trace", "data"),
        Input("loading-tick", "n_intervals"),
        State("loading-name", "data"),
    )
    def poll(_n: Any, name: str | None) -> tuple:
        progress = ctx.store.load_progress(name) if name else None
        if progress is None or progress.finished.is_set():
            # loaded (or failed, or evicted meanwhile): the page's own route says which
            loaded = {"name": name, "at": time.time()}
            return {"width": "100%"}, "loading-fill", "loaded", True, loaded
        share = progress.fraction()
        css = "loading-fill" if share is not None else "loading-fill indeterminate"
        return _fill_style(progress), css, status_text(progress), False, dash.no_update
