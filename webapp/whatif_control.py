"""The Compare page's what-if control: predict the open trace on another preset, mode or
dtype (`neuron_explorer.whatif`) and show the predicted breakdown beside the recorded one,
with the diff. The Compare page only places `layout(name)` and calls `register`."""

from __future__ import annotations

import logging
from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.webapp.components import data_table, notice, section

log = logging.getLogger("neuron_explorer.webapp")
_CHOICES = {
    "whatif-hardware": ("hardware", [("as recorded", ""), ("trn1", "trn1"), ("trn2", "trn2"),
                                     ("trn3", "trn3")]),
    "whatif-mode": ("mode", [("eager", "eager"), ("compiled", "compiled")]),
    "whatif-dtype": ("matmuls", [("as recorded", ""), ("bf16", "bf16"), ("fp8", "fp8")]),
}


def layout(name: str) -> html.Div:
    """The control: three pickers and a button, and where the prediction goes."""
    pickers = []
    for control_id, (label, options) in _CHOICES.items():
        pickers += [html.Span(f" {label} ", className="label"),
                    dcc.Dropdown(id=control_id, options=[{"label": t, "value": v}
                                                         for t, v in options],
                                 value=options[0][1], clearable=False,
                                 className="compare-picker")]
    return html.Div([
        dcc.Store(id="whatif-base", data=name),
        html.Div([html.Span("What if ", className="label"), html.Strong(name), *pickers,
                  html.Button("Predict", id="whatif-run", n_clicks=0)], className="toolbar"),
        html.Div(id="whatif-body"),
    ], className="whatif")


def prediction(ctx: Any, name: str, hardware: str, mode: str, dtype: str) -> list:
    """The predicted trace's breakdown beside the recorded one, and the diff."""
    from neuron_explorer.webapp.pages.compare import breakdown_comparison, result_frames
    from neuron_explorer.what_if.replay import whatif

    try:
        recorded = ctx.store.get(name)
        predicted = whatif(recorded, hardware or None, mode=mode, dtype=dtype or None)
    except NeuronExplorerError as exc:
        return [notice(ctx.store.public_message(str(exc)), "warning")]
    except Exception as exc:  # the page stays up
        log.exception("what-if of %s failed", name)
        return [notice(ctx.store.public_message(
            f"Could not predict {name}: unexpected {type(exc).__name__}: {exc}"), "error")]
    label = f"predicted ({predicted.hardware}, {mode}{', ' + dtype if dtype else ''})"
    parts = [section("What if: time per step",
                     breakdown_comparison(recorded, predicted, name, label))]
    result = ctx.differ(recorded, predicted)
    for attr, frame in result_frames(result):
        parts.append(section(f"What if: {attr}", data_table(frame, f"whatif-{attr}",
                                                            page_size=10)))
    return parts


def register(app: dash.Dash, ctx: Any) -> None:
    @app.callback(
        Output("whatif-body", "children"),
        Input("whatif-run", "n_clicks"),
        State("whatif-base", "data"), State("whatif-hardware", "value"),
        State("whatif-mode", "value"), State("whatif-dtype", "value"),
        prevent_initial_call=True,
    )
    def predict(clicks, base, hardware, mode, dtype):
        if not clicks or not base:
            raise PreventUpdate
        return prediction(ctx, base, hardware, mode, dtype)
