"""Serves the dashboard from a background thread, on loopback unless told otherwise.

Every request goes through `RequestGuard` (Host check, token when one is set,
security headers); the `Server` header names the dashboard only, not Werkzeug or
Python versions.
"""

from __future__ import annotations

import logging
import threading

from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.webapp.security import (
    CSP_TEMPLATE,
    TOKEN_PARAM,
    RequestGuard,
    allowed_host_names,
)
from werkzeug.serving import WSGIRequestHandler, make_server

LOOPBACK = "127.0.0.1"
SERVER_NAME = "neuron-explorer"
POLL_S = 0.05  # how often the serving loop checks for stop() (socketserver's default: 0.5 s)


class ServerError(NeuronExplorerError):
    """The dashboard cannot listen on the requested address."""


class _QuietHandler(WSGIRequestHandler):
    """Werkzeug's handler without its version (nor Python's) in the `Server` header."""

    def version_string(self) -> str:
        return SERVER_NAME


class DashboardServer:
    """A WSGI server for one app in a daemon thread: `start()`, `url`, `stop()`.

    With a `token`, every request must carry it (as `?token=`, then a cookie, or an
    `Authorization: token ...` header)."""

    def __init__(self, wsgi_app, host: str = LOOPBACK, port: int = 0,
                 token: str | None = None) -> None:
        try:
            self._server = make_server(host, port, wsgi_app, threaded=True,
                                       request_handler=_QuietHandler)
        except OSError as exc:
            raise ServerError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port"
            ) from None
        self.host = host
        self.port = self._server.server_port
        self.token = token
        csp = getattr(wsgi_app, "config", {}).get("CONTENT_SECURITY_POLICY") \
            or CSP_TEMPLATE.format(script_hashes="")
        self._server.app = RequestGuard(wsgi_app, allowed_host_names(host), token, self.port, csp)
        # stop() waits for the serving loop's next poll: a short one stops it at once
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard",
                                        kwargs={"poll_interval": POLL_S}, daemon=True)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    @property
    def url(self) -> str:
        """The address to open, with the token when one is needed."""
        return self.url_for(self.host)

    def url_for(self, host: str) -> str:
        host = f"[{host}]" if ":" in host else host
        query = f"?{TOKEN_PARAM}={self.token}" if self.token else ""
        return f"http://{host}:{self.port}/{query}"

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
