"""`neuron-explorer view [TRACE|FOLDER]`: serve traces in the dashboard and open the browser."""

from __future__ import annotations

import argparse
from pathlib import Path

from neuron_explorer.errors import NeuronExplorerError
from neuron_explorer.webapp.trace_store import DEFAULT_MAX_UPLOAD_BYTES


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", default=".",
                        help="a trace file, or a folder of traces (default: the current folder)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8050, help="port to listen on (default 8050; 0: any free)")
    parser.add_argument("--no-browser", action="store_true", help="print the URL but do not open a browser")
    parser.add_argument("--max-upload-mb", type=float, default=DEFAULT_MAX_UPLOAD_BYTES / 2**20,
                        help="largest trace the page accepts as an upload, in MiB")


def run(args: argparse.Namespace) -> int:
    return serve(Path(args.trace), host=args.host, port=args.port, open_browser=not args.no_browser,
                 max_upload_bytes=int(args.max_upload_mb * 2**20))


def start_dashboard(target: Path, host: str = "127.0.0.1", port: int = 8050,
                    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, loader=None):
    """Starts serving a trace or a folder of traces; returns the running server and its store."""
    from neuron_explorer.webapp.app import AppContext, create_app
    from neuron_explorer.webapp.server import DashboardServer
    from neuron_explorer.webapp.trace_store import TraceStore, default_loader

    if not target.exists():
        raise NeuronExplorerError(f"{target} does not exist; pass a trace file or a folder of traces")
    folder = target.parent if target.is_file() else target
    store = TraceStore(folder, loader=loader or default_loader, max_upload_bytes=max_upload_bytes)
    try:
        if target.is_file():
            default = target.resolve().relative_to(store.root).as_posix()
            store.get(default)  # a bad file is reported now, as one line
        else:
            default = newest_trace(store)
        server = DashboardServer(create_app(AppContext(store, default_trace=default)).server, host, port)
    except BaseException:
        store.close()
        raise
    return server.start(), store


def serve(target: Path, host: str = "127.0.0.1", port: int = 8050, open_browser: bool = True,
          max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES) -> int:
    """Serves a trace or a folder of traces until Ctrl-C."""
    import webbrowser

    server, store = start_dashboard(target, host, port, max_upload_bytes)
    print(f"Neuron Explorer is serving {store.root} at {server.url}  (Ctrl-C to stop)", flush=True)
    if not store.list_traces():
        print("No trace in that folder yet: upload one from the page.", flush=True)
    if open_browser:
        webbrowser.open(server.url)
    try:
        server.wait()
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        server.stop()
        store.close()
    return 0


def newest_trace(store) -> str | None:
    """The most recently written trace in the served folder, opened first."""
    names = store.list_traces()
    if not names:
        return None
    return max(names, key=lambda n: store.resolve(n).stat().st_mtime)
