"""SIGTERM's stop, bounded: ``polyindex serve`` (and each worker of ``--processes N``) exits
within ``grace + seal_s + EXIT_MARGIN_S`` seconds whatever a call or a seal is doing.

The stop itself is ``Server.stop``: stop taking calls, let those in flight finish for up to
``grace`` seconds (then gRPC cancels them), seal the write buffer. Neither a Python handler
still computing after its call was cancelled (a gRPC server's shutdown waits for its
handlers) nor a first seal that trains the collection's kinds can be interrupted, and either
kept a server up for minutes. A daemon timer ends the process at the bound instead: every
acknowledged write is in the fsynced write-ahead log and is replayed at the next start, and
a seal cut short leaves only a temporary folder the next writer removes (as after kill -9).
Each step says what it waits for on stderr.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from polyindex.config import settings

EXIT_MARGIN_S = 5.0  # closing files, the metrics server, the build process
_WORK = ("seal-", "merge-", "buffer-index-")  # thread names of the writer's background work


def say(message: str) -> None:
    print(f"polyindex: {message}", file=sys.stderr, flush=True)


def bound(grace: float | None = None, seal_s: float | None = None) -> float:
    """The most seconds from SIGTERM to exit (``POLYINDEX_SHUTDOWN_*`` by default)."""
    s = settings()
    return (s.shutdown_grace_s if grace is None else grace) + \
        (s.shutdown_seal_s if seal_s is None else seal_s) + EXIT_MARGIN_S


def _buffered(engine) -> list[str]:
    """``name (N documents)`` for each collection with writes its close will seal."""
    out = []
    for name, coll in list(getattr(engine, "_collections", {}).items()):
        online = getattr(getattr(coll, "live", None), "writes", None)
        n = online.pending().get("buffered_docs", 0) if online is not None else 0
        if n:
            out.append(f"{name} ({n} document{'s' * (n != 1)})")
    return out


def _busy() -> list[str]:
    """What is still running: calls (their handlers' threads) and background work."""
    names = [t.name for t in threading.enumerate() if t.is_alive()]
    calls = sum(n.startswith("polyindex-rpc") for n in names)
    work = sorted(n for n in names if n.startswith(_WORK))
    return ([f"{calls} call handler thread(s)"] if calls else []) + work


def stop_bounded(srv, grace: float | None = None, seal_s: float | None = None) -> None:
    """``srv.stop(grace)`` under the bound; the process is ended at the bound if it is still
    alive then (this returns only when the stop finished first)."""
    s = settings()
    grace = s.shutdown_grace_s if grace is None else grace
    seal_s = s.shutdown_seal_s if seal_s is None else seal_s
    limit = bound(grace, seal_s)
    started = time.monotonic()
    flight = srv.in_flight() if hasattr(srv, "in_flight") else {}
    calls = ", ".join(f"{n} {rpc}" for rpc, n in sorted(flight.items())) or "no calls"
    buffered = _buffered(srv.engine)
    say(f"stopping (exits within {limit:.0f} s): waiting up to {grace:g} s for {calls} in "
        f"flight, then up to {seal_s:g} s to seal "
        f"{', '.join(buffered) if buffered else 'nothing (no buffered writes)'}")

    def force() -> None:
        waited = time.monotonic() - started
        sealing = [f"sealing {b}" for b in _buffered(srv.engine)]
        say(f"shutdown still waiting after {waited:.0f} s for: "
            f"{', '.join(_busy() + sealing) or 'the engine to close'}; exiting now "
            f"(acknowledged writes are in the write-ahead log and are replayed at the next "
            f"start)")
        os._exit(0)

    timer = threading.Timer(limit, force)
    timer.daemon = True  # keeps running while the interpreter joins stuck handler threads
    timer.start()
    srv.stop(grace)
    say(f"stopped in {time.monotonic() - started:.1f} s")
