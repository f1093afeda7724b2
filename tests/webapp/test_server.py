"""The server listens on loopback only, serves every file the page needs itself, and no more."""

from __future__ import annotations

import argparse
import http.client
import re
import urllib.request

import pytest
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.webapp import view_command
from neuron_explorer.webapp.view_command import start_dashboard
from trace_files import load_trace


def _get(server, path: str) -> tuple[int, bytes]:
    """A raw GET: the path is sent as written, without the client normalising `..`."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def test_page_loads_nothing_from_the_internet(live_server):
    html = urllib.request.urlopen(live_server.url, timeout=10).read().decode()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(r.endswith(".js") or ".js?" in r or "min.js" in r for r in refs)
    assert all(not re.match(r"(https?:)?//", r) for r in refs), refs
    for ref in refs:  # every script and style sheet is served by the app
        status, body = _get(live_server, ref)
        assert status == 200 and body, ref
    assert '"disable_version_check":true' in html.replace(" ", "")


@pytest.mark.parametrize("path", [
    "/assets/../../../../etc/passwd",
    "/assets/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/_dash-component-suites/dash/../../../../../etc/passwd",
    "/assets/..%2f..%2f..%2f..%2fetc%2fpasswd",
])
def test_urls_cannot_read_files_outside_the_app(live_server, path):
    status, body = _get(live_server, path)
    assert b"root:x:0:0" not in body
    assert status != 200 or b"react-entry-point" in body  # at most the app's own page


def test_view_binds_to_loopback_and_opens_the_newest_trace(trace_folder):
    server, store = start_dashboard(trace_folder, port=0, loader=load_trace)
    try:
        assert server.host == "127.0.0.1"
        assert server._server.socket.getsockname()[0] == "127.0.0.1"
        assert urllib.request.urlopen(server.url, timeout=10).status == 200
    finally:
        server.stop()
        store.close()


def _view_args(*argv):
    parser = argparse.ArgumentParser()
    view_command.configure(parser)
    return parser.parse_args(list(argv))


def test_view_reports_a_bad_path_or_a_bad_trace_as_a_user_error(trace_folder):
    with pytest.raises(NeuronExplorerError, match="missing.json does not exist"):
        view_command.run(_view_args(str(trace_folder / "missing.json"), "--no-browser",
                                    "--port", "0"))
    with pytest.raises(NeuronExplorerError, match="corrupt.json"):
        start_dashboard(trace_folder / "corrupt.json", port=0, loader=load_trace)


def test_view_options_default_to_loopback():
    args = _view_args()
    assert (args.host, args.trace, args.no_browser) == ("127.0.0.1", ".", False)
