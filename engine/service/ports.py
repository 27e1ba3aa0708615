"""A TCP port checked with a plain socket before gRPC binds it.

gRPC's C core logs a multi-line ``chttp2_server.cc`` dump on stderr when its own bind fails,
before Python sees the error; a bind tried first says the same in one line. The probe sets
SO_REUSEADDR as gRPC's listeners do, so a previous server's connections left in TIME_WAIT
(after a clean stop, on the server's side) never block a restart on the same port, while a
socket listening there (even one that set SO_REUSEPORT) still does: Linux lets SO_REUSEADDR
share a port only with sockets that are not listening.
"""
from __future__ import annotations

import socket

from polyindex.errors import FailedPrecondition


def _addresses(host: str, port: int):
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise FailedPrecondition(f"cannot listen on {host}:{port}: {e.strerror}") from None


def bind_probe(host: str, port: int, *, reuseport: bool = False) -> socket.socket:
    """A socket bound to ``host:port`` (SO_REUSEADDR; SO_REUSEPORT when asked), not listening;
    the caller closes it. A port in use is ``FailedPrecondition`` naming it."""
    first = None
    for family, type_, proto, _, addr in _addresses(host, port):
        s = socket.socket(family, type_, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuseport:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(addr)
            return s
        except OSError as e:
            s.close()
            first = first or e
    raise FailedPrecondition(f"cannot listen on {host}:{port}: "
                             f"{first.strerror if first else 'no address'} "
                             "(another program holds the port?)")


def check_free(host: str, port: int) -> None:
    """Raise ``FailedPrecondition`` when ``host:port`` cannot be bound; port 0 always can."""
    if port:
        bind_probe(host, port).close()
