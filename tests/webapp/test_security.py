"""Who may reach the dashboard and what it tells them (#20 items 2 and 11)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from dash_requests import call, request
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.webapp.trace_store import TraceNotFoundError
from neuron_explorer.webapp.view_command import start_dashboard
from trace_files import load_trace, write_synthetic


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_a_non_loopback_host_needs_allow_remote(trace_folder, host):
    with pytest.raises(NeuronExplorerError, match="--allow-remote"):
        start_dashboard(trace_folder, host=host, port=0, loader=load_trace)


@pytest.fixture
def remote_server(trace_folder):
    server, store = start_dashboard(trace_folder, host="0.0.0.0", port=0, loader=load_trace,
                                    allow_remote=True)
    yield server
    server.stop()
    store.close()


def test_a_remote_server_needs_its_token_for_every_request(remote_server, tmp_path):
    token = remote_server.token
    trace_bytes = write_synthetic(tmp_path / "a.pftrace", steps=1, ops=4).read_bytes()
    assert token and len(token) >= 24 and f"?token={token}" in remote_server.url
    upload = {"X-Upload-Name": "a.pftrace", "Content-Type": "application/octet-stream"}
    for method, path, body, headers in [
        ("GET", "/", None, {}),
        ("GET", "/assets/style.css", None, {}),
        ("GET", "/_dash-layout", None, {}),
        ("GET", "/_dash-component-suites/dash/deps/react@18.3.1.min.js", None, {}),
        ("POST", "/_dash-update-component", b"{}", {"Content-Type": "application/json"}),
        ("POST", "/_upload", trace_bytes, upload),
        ("GET", "/?token=wrong", None, {}),
        ("GET", "/", None, {"Cookie": f"neuron_explorer_token_{remote_server.port}=wrong"}),
        ("GET", "/", None, {"Authorization": "token wrong"}),
    ]:
        status, _, _ = request(remote_server, method, path, body, headers)
        assert status == 403, (method, path, headers)
    # the token once in the URL, then a cookie; or an Authorization header
    status, headers, _ = request(remote_server, "GET",
                                 f"/timeline?token={token}&trace=run_a.pftrace")
    assert status == 302 and headers["location"] == "/timeline?trace=run_a.pftrace"
    cookie = headers["set-cookie"].split(";")[0]
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    assert request(remote_server, "GET", "/assets/style.css", headers={"Cookie": cookie})[0] == 200
    status, body = call(remote_server, "overview-findings.children",
                        {"overview-trace.data": "run_a.pftrace"}, "overview-trace.data",
                        headers={"Cookie": cookie})
    assert status == 200 and b"finding" in body
    for auth in (f"token {token}", f"Bearer {token}"):
        assert request(remote_server, "GET", "/", headers={"Authorization": auth})[0] == 200
    status, _, body = request(remote_server, "POST", "/_upload", trace_bytes,
                              {**upload, "Cookie": cookie})
    assert status == 200 and json.loads(body)["trace"] == "upload:a.pftrace"


@pytest.mark.parametrize("path, location", [
    ("/%0d%0aSet-Cookie:%20injected=1", "/%0D%0ASet-Cookie:%20injected=1"),
    ("/%0d%0a%0d%0a<html>", "/%0D%0A%0D%0A%3Chtml%3E"),
    ("/%5Cevil.com", "/%5Cevil.com"),
    ("//evil.com", "/evil.com"),
    ("/timeline/%C3%BC", "/timeline/%C3%BC"),
])
def test_the_token_redirect_stays_on_this_server_and_injects_no_header(remote_server, path,
                                                                     location):
    """The redirect that swaps the URL's token for a cookie is built from the path, which
    once carried CR/LF into the headers (an injected Set-Cookie, the CSP pushed into the
    body) and '/\\evil.com' into Location (another site, to a browser)."""
    status, headers, body = request(remote_server, "GET", f"{path}?token={remote_server.token}")
    assert status == 302 and headers["location"] == location
    assert "injected" not in headers.get("set-cookie", "") and body == b""
    assert "content-security-policy" in headers


def test_a_host_header_with_more_than_a_name_and_port_is_refused(live_server):
    for host in (f"localhost:{live_server.port}@evil.com", f"127.0.0.1:{live_server.port}/x",
                 "localhost:1:2"):
        assert request(live_server, "GET", "/", headers={"Host": host})[0] == 400, host


def test_view_with_allow_remote_prints_a_warning_and_the_token_url(trace_folder):
    write_synthetic(trace_folder / "run_a.pftrace")
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "view", str(trace_folder),
                             "--host", "0.0.0.0", "--allow-remote", "--port", "0", "--no-browser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "?token=" in line, (line, err)
    assert "warning: serving to other machines" in err


def test_view_refuses_a_remote_host_without_allow_remote_in_one_line(trace_folder):
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "view", str(trace_folder),
                           "--host", "0.0.0.0", "--port", "0", "--no-browser"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--allow-remote" in proc.stderr, proc.stderr


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1", True), ("localhost", True), ("[::1]", True), ("LOCALHOST", True),
    ("evil.example", False), ("127.0.0.1.evil.example", False), ("", False), ("localhost.", False),
])
def test_the_loopback_server_answers_only_to_loopback_names(live_server, host, allowed):
    """A page whose domain is rebound to 127.0.0.1 sends its own name as Host: refused."""
    header = f"{host}:{live_server.port}" if host else ""
    status, _, _ = request(live_server, "GET", "/", headers={"Host": header})
    assert (status == 200) == allowed, status


def test_every_answer_carries_the_security_headers_and_no_versions(live_server):
    answers = [
        request(live_server, "GET", "/"),
        request(live_server, "GET", "/assets/style.css"),
        request(live_server, "GET", "/_dash-layout"),
        request(live_server, "GET", "/", headers={"Host": "evil.example"}),
    ]
    for _status, headers, _ in answers:
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        csp = headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp
        script_src = csp.split("script-src", 1)[1].split(";", 1)[0]
        assert "unsafe-inline" not in script_src and "unsafe-eval" not in script_src
        assert headers["server"] == "neuron-explorer", headers["server"]
        sent = json.dumps(headers).lower()
        assert "python" not in sent and "werkzeug" not in sent


def test_only_trace_files_can_be_opened_from_the_served_folder(app_context, trace_folder):
    (trace_folder / "notes.txt").write_text("private notes")
    (trace_folder / "secrets.py").write_text("KEY = 1")
    calls = []
    app_context.store.loader = lambda path: calls.append(path) or load_trace(path)
    for name in ("notes.txt", "secrets.py", "run_a.pftrace.bak"):
        with pytest.raises(TraceNotFoundError, match="not a trace file"):
            app_context.store.get(name)
    assert calls == []


def test_messages_name_files_relative_to_the_served_folder(live_server, trace_folder):
    for query in ("?trace=corrupt.json", "?trace=missing.json", "?trace=sub/missing.pftrace"):
        status, body = call(live_server, "page.children",
                            {"url.pathname": "/", "url.search": query}, "url.search")
        text = json.dumps(json.loads(body))
        assert status == 200 and "Error" in text, text[:300]
        assert str(trace_folder) not in text and "/tmp" not in text, text[:500]
        assert query.split("=", 1)[1] in text
    status, body = call(live_server, "overview-findings.children",
                        {"overview-trace.data": "corrupt.json"}, "overview-trace.data")
    assert 400 <= status < 500
    assert str(trace_folder) not in body.decode() and "corrupt.json" in body.decode()
