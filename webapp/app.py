"""The Dash application: the page shell (navigation, trace picker, upload, error banner)
and routing.

Everything the browser needs (scripts, styles, fonts) is served by the app itself:
no CDN, no web fonts, so it works offline.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.webapp import loading
from neuron_explorer.webapp.components import notice
from neuron_explorer.webapp.context import AppContext
from neuron_explorer.webapp.pages import (
    compare,
    compile_page,
    engines,
    generation,
    kernel,
    memory,
    overview,
    ranks,
    roofline,
    tables,
    timeline,
)
from neuron_explorer.webapp.security import CSP_TEMPLATE
from neuron_explorer.webapp.trace_store import UploadError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.wsgi import get_input_stream

log = logging.getLogger("neuron_explorer.webapp")

ASSETS = Path(__file__).resolve().parent / "assets"
UPLOAD_PATH = "/_upload"
# a custom header: a cross-site page cannot send it without CORS
UPLOAD_NAME_HEADER = "X-Upload-Name"
MAX_CALLBACK_BYTES = 32 * 2**20  # callbacks carry small JSON; traces come through UPLOAD_PATH
PAGES = [overview, timeline, tables, engines, roofline, memory, compile_page, generation,
         compare, ranks, kernel]
PAGE_BY_PATH = {page.PATH: page for page in PAGES}


def query_params(search: str | None) -> dict[str, str]:
    """'?trace=a.json&select=3' -> {'trace': 'a.json', 'select': '3'}."""
    parsed = parse_qs((search or "").lstrip("?"), keep_blank_values=False)
    return {k: v[0] for k, v in parsed.items() if v}


def create_app(ctx: AppContext) -> dash.Dash:
    """Builds the dashboard for the traces in `ctx.store`."""
    app = dash.Dash(
        "neuron_explorer.webapp",
        title="Neuron Explorer",
        assets_folder=str(ASSETS),
        serve_locally=True,
        suppress_callback_exceptions=True,
        update_title=None,
        external_stylesheets=[],
        external_scripts=[],
    )
    # No version check against plotly's servers, no dev-tools UI: the app works offline.
    app.enable_dev_tools(debug=False, dev_tools_ui=False, dev_tools_props_check=False,
                         dev_tools_serve_dev_bundles=False, dev_tools_hot_reload=False,
                         dev_tools_disable_version_check=True)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_CALLBACK_BYTES
    app.layout = _shell(ctx)
    _register_shell_callbacks(app, ctx)
    for page in PAGES:
        page.register(app, ctx)
    loading.register(app, ctx)
    _register_upload(app, ctx)
    _register_error_handlers(app, ctx)
    # Every inline script (the renderer's start, clientside callbacks) is allowed by its hash.
    hashes = " ".join(app.csp_hashes())  # each already quoted: 'sha256-...'
    app.server.config["CONTENT_SECURITY_POLICY"] = CSP_TEMPLATE.format(script_hashes=hashes)
    return app


def _shell(ctx: AppContext) -> html.Div:
    nav = [
        dcc.Link(page.TITLE, href=page.PATH, id=_nav_id(page), className="nav-link")
        for page in PAGES
    ]
    return html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        html.Header([
            html.Div([html.Span("◆", className="brand-mark"), "Neuron Explorer"],
                     className="brand"),
            html.Nav(nav, className="nav"),
            html.Div([
                dcc.Dropdown(id="trace-picker", placeholder="Open a trace…", clearable=False,
                             className="trace-picker"),
                html.Label([  # upload.js sends the chosen file to UPLOAD_PATH as it is read
                    html.Span("Upload", className="button",
                              title=f"Open a trace from this computer (up to "
                                    f"{ctx.store.max_upload_bytes / 2**20:.0f} MiB)"),
                    dcc.Input(type="file", id="trace-upload-file", className="upload-input"),
                ], id="trace-upload", className="upload",
                   **{"data-max-bytes": str(ctx.store.max_upload_bytes),
                      "data-upload-url": UPLOAD_PATH}),
            ], className="trace-controls"),
        ], className="topbar"),
        html.Div(id="error-banner"),
        dcc.Store(id="loaded-trace"),  # set by the loading page when its trace is ready
        dcc.Loading(html.Main(id="page", className="page"), type="dot", delay_show=300),
    ])


def _nav_id(page: Any) -> str:
    return f"nav-{page.PATH.strip('/') or 'overview'}"


def _register_shell_callbacks(app: dash.Dash, ctx: AppContext) -> None:
    """The trace picker follows the URL, and the URL's page is drawn under the navigation."""
    @app.callback(
        Output("url", "search"),
        Output("trace-picker", "value"),
        Output("trace-picker", "options"),
        Input("url", "search"),
        Input("trace-picker", "value"),
    )
    def sync_trace_choice(search, picked):
        from_picker = dash.ctx.triggered_id == "trace-picker"
        return trace_choice(ctx, query_params(search), picked, from_picker)

    @app.callback(
        Output("page", "children"),
        Output("error-banner", "children"),
        *[Output(_nav_id(page), "href") for page in PAGES],
        *[Output(_nav_id(page), "className") for page in PAGES],
        Input("url", "pathname"),
        Input("url", "search"),
        Input("loaded-trace", "data"),
    )
    def route(pathname, search, _loaded):
        params = query_params(search)
        if not params.get("trace") and ctx.default_trace:
            raise PreventUpdate  # sync_trace_choice is about to put the default trace in the URL
        page = PAGE_BY_PATH.get(pathname or "/")
        body, banner = page_body(ctx, page, pathname, params)
        return body, banner, *nav_state(page, params.get("trace"))


def trace_choice(ctx: AppContext, params: dict[str, str], picked: str | None,
                 from_picker: bool) -> tuple:
    """(URL query, picker value, picker options): the URL names the open trace; the picker
    mirrors it, and a pick changes it."""
    options = [{"label": name, "value": name} for name in ctx.store.list_traces()]
    if from_picker and picked and picked != params.get("trace"):
        params["trace"] = picked
        return "?" + urlencode(params_for_new_trace(params)), picked, options
    current = params.get("trace") or ctx.default_trace
    if current and current not in {o["value"] for o in options}:
        options.append({"label": current, "value": current})
    if not params.get("trace") and current:
        return "?" + urlencode({"trace": current}), current, options
    return dash.no_update, current, options


def nav_state(page: Any, name: str | None) -> list:
    """Each navigation link's href (keeping the open trace), then its class (the page's
    is active)."""
    hrefs = [p.PATH + (f"?{urlencode({'trace': name})}" if name else "") for p in PAGES]
    classes = ["nav-link active" if p is page else "nav-link" for p in PAGES]
    return hrefs + classes


def page_body(ctx: AppContext, page: Any, pathname: str | None, params: dict[str, str]) -> tuple:
    """(page, error banner) for a URL: the page of the open trace, or a notice saying why not."""
    name = params.get("trace")
    if page is None:
        return notice(f"No page at {pathname}; use the links above.", "warning"), None
    if not name:
        return notice("No trace open: pick one from the list above or upload one.", "info"), None
    try:
        progress = ctx.store.start_loading(name)  # None: loaded already
        if progress is not None and not progress.finished.wait(loading.SHOW_AFTER_S):
            return loading.loading_layout(name, progress), None  # a big trace: show its progress
        return page_layout(ctx, page, name, params), None
    except NeuronExplorerError as exc:
        banner = error_banner(ctx.store.public_message(f"Cannot open {name}: {exc}"))
        return notice("Pick another trace from the list above.", "info"), banner
    except Exception as exc:  # a bug must not take the app down: say so, log the traceback
        log.exception("showing %s of %s failed", pathname, name)
        banner = error_banner(ctx.store.public_message(
            f"Cannot show {name}: unexpected {type(exc).__name__}: {exc} "
            "(the server log has the details)"))
        return notice("Pick another trace or page.", "info"), banner


def page_layout(ctx: AppContext, page, name: str, params: dict[str, str]):
    """A page for a trace; a page opened as a link gives it (trace and tab only) is built once and
    kept with the trace, so many users opening pages cost the server little."""
    if page is not compare and set(params) <= {"trace", "tab"}:
        key = "page:" + page.PATH + "?" + urlencode(sorted(params.items()))
        return ctx.store.derived(name, key, lambda trace: page.layout(trace, name, params, ctx))
    return page.layout(ctx.store.get(name), name, params, ctx)


def _register_upload(app: dash.Dash, ctx: AppContext) -> None:
    """POST UPLOAD_PATH: the raw file as the body, its name in UPLOAD_NAME_HEADER. The body is
    copied to disk in chunks and refused as soon as it passes the limit, never held whole."""
    from flask import jsonify, request

    @app.server.route(UPLOAD_PATH, methods=["POST"])
    def receive_upload():
        from urllib.parse import unquote

        filename = unquote(request.headers.get(UPLOAD_NAME_HEADER, ""))
        if not filename:
            message = f"an upload needs its file name in the {UPLOAD_NAME_HEADER} header"
            return jsonify(error=message), 400
        try:
            stream = get_input_stream(request.environ,
                                      max_content_length=ctx.store.max_upload_bytes)
            name = ctx.store.save_upload_stream(filename, stream)
            ctx.store.get_upload(name)  # load now, so a bad file is reported here (and not kept)
        except RequestEntityTooLarge:
            response = jsonify(error=str(ctx.store.too_large(filename)))
            response.headers["Connection"] = "close"  # the rest of the body is not read
            return response, 413
        except UploadError as exc:
            status = 413 if "upload limit" in str(exc) else 400
            return jsonify(error=ctx.store.public_message(str(exc))), status
        except NeuronExplorerError as exc:
            message = ctx.store.public_message(f"Cannot open the upload {filename}: {exc}")
            return jsonify(error=message), 400
        except Exception as exc:  # an unexpected loader failure: report it, keep the app up
            log.exception("opening the upload %s failed", filename)
            return jsonify(error=ctx.store.public_message(
                f"Cannot open the upload {filename}: unexpected {type(exc).__name__}: {exc}")), 500
        return jsonify(trace=name)


# A callback's body nests a few levels (figure relayout data, table rows); far deeper is
# no request this dashboard makes.
MAX_CALLBACK_DEPTH = 32


def callback_body(data: bytes) -> Any:
    """A callback request's JSON, or None when it is not strict JSON (NaN and Infinity are
    not JSON; Python's parser takes them) or nests deeper than MAX_CALLBACK_DEPTH."""
    import json

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        body = json.loads(data, parse_constant=no_constants)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return body if _depth(body) <= MAX_CALLBACK_DEPTH else None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_CALLBACK_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def well_formed(item: Any) -> bool:
    """An input or state as Dash sends it: {"id", "property", "value"?}, its id a string or
    (pattern-matching) an object, its property a string; a pattern-matching one is a list
    of those. A page's store of its trace's name holds a string or nothing."""
    if isinstance(item, list):
        return all(well_formed(i) for i in item)
    if not isinstance(item, dict) or not isinstance(item.get("property"), str):
        return False
    ident = item.get("id")
    if not isinstance(ident, (str, dict)):
        return False
    if isinstance(ident, str) and ident in TRACE_NAME_STORES and item["property"] == "data":
        return item.get("value") is None or isinstance(item.get("value"), str)
    return True


# the stores that hold the name of the trace a page shows (not `loaded-trace`, which
# records the load that ended: an object)
TRACE_NAME_STORES = frozenset({"overview-trace", "tables-trace", "kernel-trace"})


def _register_error_handlers(app: dash.Dash, ctx: AppContext) -> None:
    """A callback sent a name or value no page offers answers 400 with the reason, not 500."""
    from flask import jsonify, request

    @app.server.before_request
    def check_callback_request():
        """A callback request must name a callback and carry as many inputs and states as it has
        (Dash itself would fail with an IndexError deep inside)."""
        if request.path != "/_dash-update-component" or request.method != "POST":
            return None
        body = callback_body(request.get_data(cache=True))
        if not isinstance(body, dict) or not isinstance(body.get("output"), str):
            return jsonify(error="not a callback of this dashboard"), 400
        spec = app.callback_map.get(body["output"])
        if spec is None:
            return jsonify(error="not a callback of this dashboard"), 400
        if "callback" not in spec:
            return jsonify(error="that callback runs in the browser, not on the server"), 400
        for part in ("inputs", "state"):
            sent = body.get(part) or []
            if not isinstance(sent, list) or len(sent) != len(spec[part]):
                return jsonify(error=f"this callback takes {len(spec[part])} {part}"), 400
            bad = next((item for item in sent if not well_formed(item)), None)
            if bad is not None:
                return jsonify(error=f"an item of {part} is not what this dashboard sends"), 400
        return None

    @app.server.errorhandler(NeuronExplorerError)
    def user_error(exc):
        return jsonify(error=ctx.store.public_message(str(exc))), 400

    @app.server.errorhandler(HTTPException)
    def http_error(exc):
        return jsonify(error=exc.description), exc.code


def params_for_new_trace(params: dict[str, str]) -> dict[str, str]:
    """Query parameters that still make sense once another trace is opened."""
    return {k: v for k, v in params.items() if k in ("trace", "other")}


def error_banner(message: str) -> html.Div:
    """The red bar at the top of the page; the app keeps working under it."""
    return html.Div([html.Strong("Error: "), message], className="error-banner", role="alert")
