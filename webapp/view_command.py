"""`neuron-explorer view [TRACE|FOLDER]`: serve traces in the dashboard and open the browser.

The dashboard listens on loopback. Serving it to other machines takes `--allow-remote`
and then a token in every request (printed with the URL, as Jupyter does).
"""

from __future__ import annotations

import argparse
import atexit
import signal
import sys
from pathlib import Path

from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.webapp.security import is_loopback, is_wildcard, new_token
from neuron_explorer.webapp.trace_store import DEFAULT_MAX_UPLOAD_BYTES, DEFAULT_MAX_UPLOADS

FIRST_LOAD_WAIT_S = 1.0  # how long `view TRACE` waits to report a bad file before serving


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", default=".",
                        help="a trace file, or a folder of traces (default: the current folder)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; "
                             "any other address needs --allow-remote)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host other machines can reach; every request then "
                             "needs the printed token")
    parser.add_argument("--port", type=int, default=8050,
                        help="port to listen on (default 8050; 0: any free)")
    parser.add_argument("--no-browser", action="store_true",
                        help="print the URL but do not open a browser")
    parser.add_argument("--max-upload-mb", type=float, default=DEFAULT_MAX_UPLOAD_BYTES / 2**20,
                        help="largest trace the page accepts as an upload, in MiB")
    parser.add_argument("--max-uploads", type=int, default=DEFAULT_MAX_UPLOADS,
                        help="uploads kept at once; the oldest go first (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    return serve(Path(args.trace), host=args.host, port=args.port, open_browser=not args.no_browser,
                 max_upload_bytes=int(args.max_upload_mb * 2**20), allow_remote=args.allow_remote,
                 max_uploads=args.max_uploads)


def check_host(host: str, allow_remote: bool) -> str | None:
    """The token remote serving needs, None on loopback; refuses a remote host without
    allow_remote."""
    if is_loopback(host):
        return None
    if not allow_remote:
        raise NeuronExplorerError(
            f"--host {host} would serve the dashboard and its traces to other machines; "
            "add --allow-remote to do so (every request then needs a token), or leave --host out")
    return new_token()


def start_dashboard(target: Path, host: str = "127.0.0.1", port: int = 8050,
                    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, loader=None,
                    allow_remote: bool = False, max_uploads: int = DEFAULT_MAX_UPLOADS):
    """Starts serving a trace or a folder of traces; returns the running server and its store."""
    from neuron_explorer.webapp.app import AppContext, create_app
    from neuron_explorer.webapp.server import DashboardServer
    from neuron_explorer.webapp.trace_store import TraceStore, default_loader

    token = check_host(host, allow_remote)
    if not target.exists():
        raise NeuronExplorerError(
            f"{target} does not exist; pass a trace file or a folder of traces")
    # a linked file: its real folder
    folder = target.resolve().parent if target.is_file() else target
    store = TraceStore(folder, loader=loader or default_loader, max_upload_bytes=max_upload_bytes,
                       max_uploads=max_uploads)
    default: str | None
    try:
        default = (target.resolve().relative_to(store.root).as_posix() if target.is_file()
                   else newest_trace(store))
        app = create_app(AppContext(store, default_trace=default))
        server = DashboardServer(app.server, host, port, token=token).start()
    except BaseException:
        store.close()
        raise
    if target.is_file() and default is not None:
        # the server answers at once (a loading page with the load's progress); a file that
        # is not a trace fails fast and is reported now, as one line
        progress = store.start_loading(default)
        if progress is not None and progress.finished.wait(FIRST_LOAD_WAIT_S) and progress.error:
            server.stop()
            store.close()
            raise progress.error
    return server, store


def serve(target: Path, host: str = "127.0.0.1", port: int = 8050, open_browser: bool = True,
          max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, allow_remote: bool = False,
          max_uploads: int = DEFAULT_MAX_UPLOADS) -> int:
    """Serves a trace or a folder of traces until Ctrl-C or SIGTERM; the uploads go with it."""
    import webbrowser

    server, store = start_dashboard(target, host, port, max_upload_bytes, allow_remote=allow_remote,
                                    max_uploads=max_uploads)
    atexit.register(store.close)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for name, why in sorted(store.skipped.items()):
            print(f"warning: skipping {name}: {why}", file=sys.stderr, flush=True)
        if server.token:
            print(f"warning: serving to other machines on {host}: anyone with the token can read "
                  "these traces and upload files", file=sys.stderr, flush=True)
        served = (f"{target.name} (and the other traces in {store.root})" if target.is_file()
                  else str(store.root))
        print(f"Neuron Explorer is serving {served} at {server.url}  (Ctrl-C to stop)",
              flush=True)
        if server.token and is_wildcard(host):
            print(f"  or {server.url_for('127.0.0.1')}", flush=True)
        if not store.list_traces():
            print("No trace in that folder yet: upload one from the page.", flush=True)
        if open_browser:
            webbrowser.open(server.url_for("127.0.0.1") if is_wildcard(host) else server.url)
        server.wait()
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        store.close()
    return 0


def _exit_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # leaves through serve's cleanup, like Ctrl-C


def newest_trace(store) -> str | None:
    """The most recently written trace in the served folder, opened first."""
    names = store.list_traces()
    if not names:
        return None
    return max(names, key=lambda n: store.resolve(n).stat().st_mtime)
