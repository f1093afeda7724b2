"""Who may talk to the dashboard: a Host check against DNS rebinding, a token for remote
serving, and the headers that keep the page out of frames and the browser from guessing types.

`RequestGuard` wraps the WSGI app, so every request passes through it: pages, Dash's
scripts and callbacks, and uploads alike.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
import socket
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, quote, urlencode

import psutil

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
TOKEN_PARAM = "token"

# Dash serves its scripts from this app; the one inline script (the renderer's start) is
# allowed by its hash. Plotly sets inline styles (so does AG Grid, whose theme is a style
# element it writes) and draws with data:/blob: images.
CSP_TEMPLATE = ("default-src 'self'; script-src 'self' {script_hashes}; "
                "style-src 'self' 'unsafe-inline'; "
                "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
                "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in ("", "0.0.0.0", "::")


def allowed_host_names(bound: str) -> frozenset[str]:
    """The names a browser may use in the Host header to reach a server bound to `bound`.

    Loopback servers answer only to loopback names, so a page on another site whose
    name is rebound to 127.0.0.1 is refused. A wildcard bind answers to this machine's
    names and addresses."""
    bound = bound.strip("[]").lower()
    if is_loopback(bound):
        return LOOPBACK_NAMES | {bound}
    names = {bound}
    if is_wildcard(bound):
        names |= LOOPBACK_NAMES
        for addresses in psutil.net_if_addrs().values():
            names |= {a.address.split("%")[0].lower() for a in addresses
                      if a.family in (socket.AF_INET, socket.AF_INET6)}
    hostname = socket.gethostname().lower()
    names |= {hostname, hostname.split(".")[0], socket.getfqdn().lower()}
    return frozenset(n for n in names if n)


def local_location(path: str) -> str:
    """A redirect target on this server for a request's (decoded) path: percent-encoded, so
    no CR/LF or other control character reaches the header, and starting with exactly one
    '/' (browsers read '//host' and '/\\host' as another site)."""
    raw = path.encode("latin-1", "replace")  # WSGI decodes the path's bytes as latin-1
    return "/" + quote(raw, safe=_PATH_SAFE).lstrip("/")


_PATH_SAFE = "/-._~!$&'()*+,;=:@"  # RFC 3986 pchar and '/', less '%' and '\\'
# A Host header is a name or an address and an optional port: nothing else
_HOST_HEADER = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:\d{1,5})?$")


def host_name(header: str) -> str:
    """'example.org:8050' -> 'example.org'; '[::1]:8050' -> '::1'; '' for anything that is
    not a host and port ('localhost:1@evil.com')."""
    header = header.strip().lower()
    if not _HOST_HEADER.match(header):
        return ""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class RequestGuard:
    """WSGI middleware: refuses unknown Host headers and, when a token is set, requests without it;
    adds the security headers to every answer."""

    def __init__(self, app: Callable, allowed_hosts: Iterable[str], token: str | None,
                 port: int, csp: str) -> None:
        self.app = app
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.token = token
        self.cookie = f"neuron_explorer_token_{port}"
        self.headers = [
            ("X-Frame-Options", "DENY"),
            ("X-Content-Type-Options", "nosniff"),
            ("Content-Security-Policy", csp),
            ("Referrer-Policy", "no-referrer"),
        ]

    def __call__(self, environ: dict, start_response: Callable):
        def secured(status, headers, exc_info=None):
            names = {k.lower() for k, _ in headers}
            headers = list(headers) + [(k, v) for k, v in self.headers if k.lower() not in names]
            return start_response(status, headers, exc_info)

        if host_name(environ.get("HTTP_HOST", "")) not in self.allowed_hosts:
            return _plain(secured, "400 Bad Request",
                          "This dashboard does not answer to that host name; open the URL "
                          "`view` printed.")
        if self.token is None:
            return self.app(environ, secured)
        query = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        if self._matches(query.get(TOKEN_PARAM)):
            if environ.get("REQUEST_METHOD") == "GET":  # swap the token in the URL for a cookie
                rest = urlencode({k: v for k, v in query.items() if k != TOKEN_PARAM})
                location = local_location(environ.get("PATH_INFO", "/")) + \
                    ("?" + rest if rest else "")
                cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                secured("302 Found", [("Location", location), ("Set-Cookie", cookie),
                                      ("Content-Length", "0")])
                return [b""]
            return self.app(environ, secured)
        if self._matches(self._cookie_token(environ)) or self._matches(_header_token(environ)):
            return self.app(environ, secured)
        return _plain(secured, "403 Forbidden",
                      "This dashboard needs its token: open the URL with ?token=... that "
                      "`view` printed.")

    def _matches(self, candidate: str | None) -> bool:
        if not candidate or self.token is None:
            return False
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def _cookie_token(self, environ: dict) -> str | None:
        cookies = SimpleCookie()
        try:
            cookies.load(environ.get("HTTP_COOKIE", ""))
        except CookieError:  # a malformed cookie header is as good as none
            return None
        morsel = cookies.get(self.cookie)
        return morsel.value if morsel else None


def _header_token(environ: dict) -> str | None:
    """`Authorization: token XYZ` (as Jupyter takes it) or `Authorization: Bearer XYZ`."""
    scheme, _, value = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    return value.strip() if scheme.lower() in ("token", "bearer") else None


def _plain(start_response: Callable, status: str, message: str) -> list[bytes]:
    body = (message + "\n").encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))])
    return [body]
