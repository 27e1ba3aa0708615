"""The console's HTTP server: the standard library's ThreadingHTTPServer in a thread, the
pages and their JS shipped in ``static/`` (no build step), JSON under ``/api/``.

Read-only: it answers GET only, and its calls are the SDK's reads (Query, Describe, Stats,
List); a write never goes through it.
"""
from __future__ import annotations

import json
import logging
import math
import mimetypes
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

from polyindex.console.access import Access
from polyindex.console.api import Api
from polyindex.errors import PolyindexError

STATIC = Path(__file__).resolve().parent / "static"
PAGES = {"/": "collections.html", "/collections": "collections.html",
         "/search": "search.html", "/compare": "compare.html", "/evaluate": "evaluate.html"}
API = {"/api/overview": "overview", "/api/metrics": "metrics", "/api/search": "search",
       "/api/compare": "compare", "/api/files": "file_list", "/api/eval": "evaluate"}
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "NOT_FOUND": 404,
               "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 412, "RESOURCE_EXHAUSTED": 429,
               "UNAVAILABLE": 503, "CANCELLED": 499}
LOGIN = """<!doctype html><meta charset="utf-8"><title>polyindex console: token</title>
<link rel="stylesheet" href="/static/console.css"><main class="login"><h1>polyindex console</h1>
<p>This server needs its bearer token (the contents of <code>serve --token-file</code>).</p>
<form method="get"><input type="password" name="token" placeholder="token" autofocus>
<button>Open</button></form></main>"""
MAX_QUERY_BYTES = 64 * 1024
log = logging.getLogger("polyindex.console")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # TIME_WAIT never blocks a restart; a listener still does (ports.py)


class Handler(BaseHTTPRequestHandler):
    server_version = "polyindex-console"
    api: Api
    access: Access

    def log_message(self, fmt, *args) -> None:  # no line per request on the server's stderr
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not self.access.host_allowed(self.headers.get("Host")):
            return self._send(HTTPStatus.MISDIRECTED_REQUEST, b"unknown host\n", "text/plain")
        url = urlsplit(self.path)
        if len(url.query) > MAX_QUERY_BYTES:
            return self._send(HTTPStatus.REQUEST_URI_TOO_LONG, b"request too long\n",
                              "text/plain")
        params = parse_qs(url.query, keep_blank_values=True)
        if url.path.startswith("/static/"):  # the pages' own files: no data, no token
            return self._static(url.path[len("/static/"):])
        if "token" in params and not url.path.startswith("/api/"):
            return self._login(url.path, params)
        if not self.access.authorized(self.headers):
            if url.path.startswith("/api/"):
                return self._json(401, {"error": "missing or invalid bearer token",
                                        "status": "UNAUTHENTICATED"})
            return self._send(401, LOGIN.encode(), "text/html; charset=utf-8",
                              {"WWW-Authenticate": 'Bearer realm="polyindex"'})
        if url.path in PAGES:
            return self._static(PAGES[url.path])
        if url.path in API:
            try:
                payload = getattr(self.api, API[url.path])(params)
            except PolyindexError as e:
                return self._json(HTTP_STATUS.get(e.status, 500),
                                  {"error": str(e), "status": e.status})
            except Exception:  # noqa: BLE001 - a bug: one line on stderr, a 500, not a dead page
                log.exception("console: %s failed", url.path)
                return self._json(500, {"error": "internal error (see the server's log)",
                                        "status": "INTERNAL"})
            return self._json(200, payload)
        self._send(404, b"not found\n", "text/plain")

    def _login(self, path: str, params: dict) -> None:
        """A page opened with ``?token=T``: the session cookie, and on to the page without it."""
        if not self.access.check_token(params.pop("token")[-1]):
            return self._send(401, LOGIN.encode(), "text/html; charset=utf-8",
                              {"WWW-Authenticate": 'Bearer realm="polyindex"'})
        rest = urlencode(params, doseq=True)
        path = path if path in PAGES else "/"  # only our own pages: never a redirect elsewhere
        self._send(303, b"", "text/plain", {"Location": path + ("?" + rest if rest else ""),
                                            "Set-Cookie": self.access.session_cookie()})

    def _static(self, name: str) -> None:
        path = (STATIC / name).resolve()
        if STATIC not in path.parents or not path.is_file():
            return self._send(404, b"not found\n", "text/plain")
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        self._send(200, path.read_bytes(), ctype, {"Cache-Control": "no-cache"})

    def _json(self, code: int, payload) -> None:
        body = json.dumps(_finite(payload), allow_nan=False, default=str).encode()
        self._send(code, body, "application/json")

    def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


def _finite(value):
    """JSON has no NaN or infinity (a stage's padding score, a missing feature): null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class Console:
    """A running console: ``port``, ``url``, ``stop()``."""

    def __init__(self, httpd: _Server, thread: threading.Thread, host: str, closers):
        self._httpd, self._thread, self._closers = httpd, thread, closers
        self.host, self.port = host, httpd.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        for close in self._closers:
            close()


def start(api: Api, access: Access, host: str = "127.0.0.1", port: int = 0,
          closers=()) -> Console:
    """Serve the console on host:port (0: a free port) in a daemon thread."""
    handler = type("ConsoleHandler", (Handler,), {"api": api, "access": access})
    server_cls = _Server
    if ":" in host:
        server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
    try:
        httpd = server_cls((host.strip("[]"), port), handler)
    except OSError as e:
        from polyindex.errors import Internal
        raise Internal(f"console: cannot listen on {host}:{port}: {e.strerror or e}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="polyindex-console", daemon=True)
    thread.start()
    return Console(httpd, thread, host, list(closers))


def say(console: Console) -> None:
    print(f"polyindex console on {console.url}", flush=True, file=sys.stdout)
