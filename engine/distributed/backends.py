"""How the router reaches its shards: Ray actors (``RayShards``) or objects in this process
(``LocalShards``, for tests and one-machine tools).

Both answer ``each({shard: (method, *args)})`` with ``{shard: result}``. Reads go to the
shard's replicas in turn and fall over to the next replica when one is dead or restarting;
writes go to replica 0 (the shard's writer), retried while Ray restarts it (every write is
an idempotent upsert or delete by id). A shard no replica answers raises ``Unavailable``,
or, with ``allow_partial``, is answered with None.

``at={shard: replica}`` pins calls to the replica that answered an earlier call (a query's
rerank calls go to the replica its retrieve read: the candidates are rows of that replica's
snapshot); a pinned replica that is gone answers ``LOST``, and the router asks again from
the retrieve. ``each(..., replicas=True)`` also returns which replica answered each shard.
"""
from __future__ import annotations

import itertools
import time

from polyindex.errors import PolyindexError
from polyindex.wire.grpc_errors import Unavailable

WRITE_RETRY_S = 30.0  # how long a write waits for Ray to restart a shard's writer
LOST = "lost"  # a pinned replica's answer when it is gone (its snapshots with it)


class _Refused(Exception):
    """A call an actor refused at submission (Ray no longer knows it)."""


class LocalShards:
    """Shards as plain objects in this process: ``shards[s]`` one ``Shard``, or a list of
    its replicas (the writer first, then read-only followers of its WAL); reads rotate."""

    def __init__(self, shards: list):
        self.replicas = [list(s) if isinstance(s, (list, tuple)) else [s] for s in shards]
        self.shards = [r[0] for r in self.replicas]  # the writers
        self.n_shards, self.n_replicas = len(shards), len(self.replicas[0])
        self._turn = itertools.count()

    def one(self, method: str, *args):
        return getattr(self.shards[0], method)(*args)

    def each(self, calls: dict, write: bool = False, allow_partial: bool = False,
             at: dict | None = None, replicas: bool = False):
        start = next(self._turn)
        used = {s: 0 if write else at[s] if at else (start + s) % self.n_replicas
                for s in calls}
        out = {s: getattr(self.replicas[s][used[s]], c[0])(*c[1:]) for s, c in calls.items()}
        return (out, used) if replicas else out

    def broadcast(self, calls: dict) -> None:
        for s, c in calls.items():
            for shard in self.replicas[s]:
                getattr(shard, c[0])(*c[1:])

    def close(self) -> None:
        for group in ([r for rs in self.replicas for r in rs[1:]], self.shards):
            for shard in group:
                shard.close()


class RayShards:
    """Shards as Ray actors: ``handles[shard][replica]``."""

    def __init__(self, handles: list[list]):
        import ray
        self.ray, self.handles = ray, handles
        self.n_shards, self.n_replicas = len(handles), len(handles[0])
        self._turn = itertools.count()

    def _dead(self):
        e = self.ray.exceptions
        return tuple(c for c in (getattr(e, "RayActorError", None),
                                 getattr(e, "ActorUnavailableError", None),
                                 getattr(e, "ActorDiedError", None)) if c is not None)

    def one(self, method: str, *args):
        return self.each({0: (method, *args)})[0]

    def each(self, calls: dict, write: bool = False, allow_partial: bool = False,
             at: dict | None = None, replicas: bool = False):
        start = next(self._turn)
        # per shard: the replicas to try, in order (reads rotate; writes: the writer only;
        # pinned: that replica only)
        order = {s: ([0] if write else [at[s]] if at else
                     [(start + s + i) % self.n_replicas for i in range(self.n_replicas)])
                 for s in calls}
        used = {s: order[s][0] for s in calls}
        pending = {s: self._send(s, order[s].pop(0), calls[s]) for s in calls}
        out, deadline = {}, time.monotonic() + WRITE_RETRY_S
        dead = (*self._dead(), _Refused)
        while pending:
            for s, ref in list(pending.items()):
                try:
                    if isinstance(ref, _Refused):
                        raise ref
                    out[s] = self.ray.get(ref)
                    del pending[s]
                except dead as e:
                    if at:  # the replica holding the query's snapshot is gone
                        out[s] = LOST
                        del pending[s]
                    elif order[s]:
                        used[s] = order[s][0]
                        pending[s] = self._send(s, order[s].pop(0), calls[s])
                    elif write and time.monotonic() < deadline:
                        time.sleep(0.2)  # Ray is restarting the writer
                        used[s] = 0
                        pending[s] = self._send(s, 0, calls[s])
                    elif allow_partial:
                        out[s] = None
                        del pending[s]
                    else:
                        raise Unavailable(f"shard {s}: no replica answered "
                                          f"({type(e).__name__})") from None
                except self.ray.exceptions.RayTaskError as e:
                    cause = e.cause if hasattr(e, "cause") else None
                    if isinstance(cause, PolyindexError):
                        raise cause from None
                    raise
        return (out, used) if replicas else out

    def broadcast(self, calls: dict) -> None:
        """Every replica of each named shard; a dead replica is skipped (it asks again)."""
        refs = [self._send(s, r, c) for s, c in calls.items() for r in range(self.n_replicas)]
        for ref in refs:
            try:
                if not isinstance(ref, _Refused):
                    self.ray.get(ref)
            except self._dead():
                pass

    def _send(self, shard: int, replica: int, call: tuple):
        method, *args = call
        try:
            return self.handles[shard][replica].call.remote(method, *args)
        except Exception as e:  # an actor Ray no longer knows is refused at submission
            if "dead" not in str(e) and "Can't find actor" not in str(e):
                raise
            return _Refused(e)  # raised where its answer is awaited: one fall-over path
