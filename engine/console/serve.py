"""The console beside a running server (``polyindex serve --console-port P``): a client of
the server's own gRPC port with its token, the load sampler, the pages."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from polyindex.console import http
from polyindex.console.access import Access
from polyindex.console.api import Api
from polyindex.console.files import Files
from polyindex.console.sampler import Sampler

ANY_ADDRESS = {"0.0.0.0", "::", "[::]", ""}


def client_address(address: str) -> str:
    """The server's address as its own client dials it: a server bound to every address
    is reached over loopback."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host.strip("[]") in ANY_ADDRESS or host in ANY_ADDRESS \
        else address


def start_console(address: str, token: str | None, *, host: str = "127.0.0.1",
                  port: int = 0, root, loopback: bool = True, tls_cert=None,
                  latency: Callable[[], tuple[float, float]] | None = None) -> http.Console:
    """Serve the console of the gRPC server at ``address`` on host:port. ``root``: the
    folder evaluation files are read under; ``latency``: the server's Query latency
    (count, seconds), when it runs in the server's process."""
    from polyindex.client.remote import Client
    tls = None if tls_cert is None else Path(tls_cert).read_bytes()
    client = Client(client_address(address), token=token, tls=tls)
    # requests_all: summed over the processes of `serve --processes N` (one process: its own)
    sampler = Sampler(lambda: client.stats(processes=True)["requests_all"].get("Query", 0),
                      latency)
    try:
        sampler.start()
        console = http.start(Api(client, Files(root), sampler), Access(token, host, loopback),
                             host=host, port=port, closers=(sampler.stop, client.close))
    except BaseException:
        sampler.stop()
        client.close()
        raise
    http.say(console)
    return console
