"""Who may use the console: the gRPC service's bearer token, and the Host a request names.

A browser cannot send an ``authorization`` header with a link, so besides the header the
console takes the token once (``?token=T`` on any page, or the 401 page's form), answers with
an HttpOnly, SameSite=Strict cookie holding a digest of it (not the token) and sends the
browser on to the page without the token in its address. Without either: 401, as the gRPC
service answers UNAUTHENTICATED. A console bound to loopback also refuses a ``Host`` header
naming anything but loopback (DNS rebinding: a page elsewhere resolving its own name to
127.0.0.1 would otherwise reach it).
"""
from __future__ import annotations

import hashlib
import hmac
from http.cookies import SimpleCookie

COOKIE = "polyindex_console"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


class Access:
    def __init__(self, token: str | None, host: str, loopback: bool):
        self.token = token
        self._session = (hmac.new(token.encode(), b"polyindex console", hashlib.sha256)
                         .hexdigest() if token else None)
        self._host = host.strip("[]").lower()
        self._loopback = loopback

    @property
    def open(self) -> bool:
        return self.token is None

    def host_allowed(self, header: str | None) -> bool:
        """Whether the request's Host names this console (loopback consoles only check)."""
        if not self._loopback:
            return True
        if not header:
            return False
        name = header.strip().lower()
        name = name[1:name.index("]")] if name.startswith("[") and "]" in name else \
            name.rsplit(":", 1)[0] if name.count(":") == 1 else name
        return name in LOOPBACK_NAMES or name == self._host

    def authorized(self, headers) -> bool:
        """A request with the token as a bearer header or the session cookie."""
        if self.token is None:
            return True
        auth = headers.get("Authorization") or ""
        if auth and hmac.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
            return True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("Cookie") or "")
        except Exception:  # noqa: BLE001 - a malformed cookie header is no session
            return False
        got = cookie.get(COOKIE)
        return got is not None and hmac.compare_digest(got.value.encode(), self._session.encode())

    def check_token(self, given: str | None) -> bool:
        return (self.token is not None and given is not None
                and hmac.compare_digest(given.encode(), self.token.encode()))

    def session_cookie(self) -> str:
        return f"{COOKIE}={self._session}; Path=/; HttpOnly; SameSite=Strict"
