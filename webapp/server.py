"""Serves the dashboard from a background thread, on loopback unless told otherwise."""

from __future__ import annotations

import logging
import threading

from neuron_explorer.errors import NeuronExplorerError
from werkzeug.serving import make_server

LOOPBACK = "127.0.0.1"


class ServerError(NeuronExplorerError):
    """The dashboard cannot listen on the requested address."""


class DashboardServer:
    """A WSGI server for one app in a daemon thread: `start()`, `url`, `stop()`."""

    def __init__(self, wsgi_app, host: str = LOOPBACK, port: int = 0) -> None:
        try:
            self._server = make_server(host, port, wsgi_app, threaded=True)
        except OSError as exc:
            raise ServerError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port"
            ) from None
        self.host = host
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard", daemon=True)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> DashboardServer:
        self._thread.start()
        return self

    def wait(self) -> None:
        """Blocks until the server stops (Ctrl-C raises KeyboardInterrupt here)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
