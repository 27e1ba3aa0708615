"""Who can reach a server: beyond loopback, plaintext without a token needs ``--insecure``.

A server bound to another address than loopback, with no token and no TLS, lets anyone who
reaches the address read, write and drop every collection; it is refused unless the user says
``--insecure`` (then it serves, with a warning). Checked before anything binds.
"""
from __future__ import annotations

import ipaddress
import socket

from polyindex.errors import InvalidArgument

FLAG = "--insecure"


def _loopback_ip(text: str) -> bool:
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1
    return ip.is_loopback


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (a name is resolved)."""
    host = host.strip().strip("[]")
    if not host:
        return False  # gRPC reads an empty host as every address
    try:
        return _loopback_ip(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False  # the bind fails later and says so
    return bool(infos) and all(_loopback_ip(info[4][0]) for info in infos)


def check_exposure(host: str, *, token: bool, tls: bool, insecure: bool) -> str | None:
    """Raise ``InvalidArgument`` when ``host`` is beyond loopback with neither a token nor
    TLS and not ``insecure``; the warning to print when ``insecure`` lets it through."""
    if token or tls or is_loopback(host):
        return None
    if not insecure:
        raise InvalidArgument(f"--host {host} is beyond loopback and the server would have no "
                              "token and no TLS (anyone who reaches it could read, write and "
                              "drop every collection): give --token-file and/or --tls-cert/"
                              f"--tls-key, or {FLAG} to serve it so anyway")
    return (f"polyindex: warning: serving {host} beyond loopback in plaintext with no token "
            f"({FLAG}): anyone who reaches it can read, write and drop every collection")
