"""Sharded serving on Ray: a data directory of S shards, each served by R Ray actors.

Layout: ``DATA/shards.json`` (``{"shards": S}``, fixed when the directory is created) and
one ordinary data directory per shard, ``DATA/shard-000`` ... (each can be opened, verified,
compacted or queried alone with the usual tools). Replica 0 of a shard is its writer (the
directory's lock and WAL, online seals and merges); replicas 1..R-1 are read-only followers
of that WAL (``Engine(readonly=True)``), so a write acknowledged by the writer is read by
every replica within the followers' bound. Actors are restarted by Ray when they die
(``max_restarts``); the router falls over to another replica meanwhile.

``ShardedEngine`` has the surface the gRPC servicer uses (``collection``, ``create_collection``,
``drop_collection``, ``list_collections``), so ``polyindex serve --ray --shards S`` is the usual
server with this engine behind it, and the SDK is unchanged.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from polyindex.config import DEFAULT_INDEXES, DEFAULT_MODEL, settings
from polyindex.distributed import cluster
from polyindex.distributed.backends import LocalShards, RayShards
from polyindex.distributed.router import ShardedCollection
from polyindex.errors import FailedPrecondition, InvalidArgument, NotFound
from polyindex.storage.fsutil import write_atomic

LAYOUT_FILE = "shards.json"
MAX_RESTARTS = 5


class ShardActor:
    """The Ray actor: one replica of one shard (a ``Shard`` behind a generic ``call``)."""

    def __init__(self, path: str, readonly: bool, shard: int, replica: int):
        from polyindex.distributed.shard import Shard
        self.shard = Shard(path, readonly=readonly, shard=shard, replica=replica)

    def call(self, method: str, *args):
        return getattr(self.shard, method)(*args)


def shard_count(path: Path, shards: int | None) -> int:
    """The directory's shard count; a new directory takes ``shards`` (written once)."""
    layout = path / LAYOUT_FILE
    if layout.is_file():
        have = int(json.loads(layout.read_text())["shards"])
        if shards is not None and shards != have:
            raise FailedPrecondition(f"{path} holds {have} shards; it cannot be served as "
                                     f"{shards} (resharding is not supported)")
        return have
    if shards is None or shards < 1:
        raise InvalidArgument(f"{path} is not a sharded data directory: give --shards S "
                              "to create one")
    if path.exists() and any(p.name != LAYOUT_FILE for p in path.iterdir()):
        raise FailedPrecondition(f"{path} is an unsharded data directory; serve it without "
                                 "--shards, or give an empty directory")
    path.mkdir(parents=True, exist_ok=True)
    write_atomic(layout, (json.dumps({"shards": shards}) + "\n").encode())
    return shards


class ShardedEngine:
    def __init__(self, path: str | Path, *, shards: int | None = None, replicas: int = 1,
                 address: str | None = None, num_cpus: int | None = None):
        if replicas < 1:
            raise InvalidArgument(f"replicas must be at least 1, got {replicas}")
        self.path = Path(path).resolve()
        self.readonly = False
        self.n_shards = shard_count(self.path, shards)
        self._started_ray = not cluster.require_ray().is_initialized() if not address else False
        ray = cluster.start(address, num_cpus=num_cpus)
        actor = ray.remote(max_restarts=MAX_RESTARTS, num_cpus=0)(ShardActor)
        folders = [str(self.path / f"shard-{s:03d}") for s in range(self.n_shards)]
        # writers first: each creates its directory and replays its WAL before followers read
        writers = [actor.options(scheduling_strategy="SPREAD").remote(f, False, s, 0)
                   for s, f in enumerate(folders)]
        ray.get([w.call.remote("ping") for w in writers])
        followers = [[actor.options(scheduling_strategy="SPREAD").remote(f, True, s, r)
                      for r in range(1, replicas)] for s, f in enumerate(folders)]
        ray.get([h.call.remote("ping") for hs in followers for h in hs])
        self.handles = [[w, *fs] for w, fs in zip(writers, followers)]
        self.backend = RayShards(self.handles)
        self._collections: dict[str, ShardedCollection] = {}

    @classmethod
    def in_process(cls, path: str | Path, *, shards: int | None = None,
                   replicas: int = 1) -> "ShardedEngine":
        """The same router over shards in this process (no Ray; replica 0 of a shard its
        writer, the others read-only followers of its WAL, as the actors): for tests and
        one-machine tools; the answers are the Ray deployment's."""
        from polyindex.distributed.shard import Shard
        if replicas < 1:
            raise InvalidArgument(f"replicas must be at least 1, got {replicas}")
        self = cls.__new__(cls)
        self.path = Path(path).resolve()
        self.readonly = False
        self.n_shards = shard_count(self.path, shards)
        self.handles, self._started_ray = [], False
        folders = [self.path / f"shard-{s:03d}" for s in range(self.n_shards)]
        writers = [Shard(f, shard=s) for s, f in enumerate(folders)]  # before the followers
        self.backend = LocalShards([[w, *(Shard(f, readonly=True, shard=s, replica=r)
                                          for r in range(1, replicas))]
                                    for s, (f, w) in enumerate(zip(folders, writers))])
        self._collections = {}
        return self

    # -- the engine surface ----------------------------------------------------------------
    def list_collections(self) -> list[str]:
        return self.backend.one("names")

    def collection(self, name: str) -> ShardedCollection:
        coll = self._collections.get(name)
        if coll is None:
            names = self.list_collections()
            if name not in names:  # as one node says it
                raise NotFound(f"collection {name!r} not found (have: "
                               f"{', '.join(names) or 'none'})")
            coll = self._collections[name] = ShardedCollection(name, self.backend)
        return coll

    def create_collection(self, name: str, indexes: Sequence[str] = DEFAULT_INDEXES, *,
                          model: str | None = DEFAULT_MODEL, dtype: str = "auto",
                          segment_size: int = 50_000, fields: dict[str, str] | None = None,
                          profiles: dict[str, dict] | None = None,
                          exist_ok: bool = False) -> ShardedCollection:
        from polyindex.encode.precision import resolve
        dtype = resolve(dtype)[0]  # chosen once here: every shard (any node) encodes alike
        kw = {"model": model, "dtype": dtype, "segment_size": segment_size, "fields": fields,
              "profiles": profiles, "exist_ok": exist_ok}
        self.backend.each({s: ("create", name, list(indexes), kw)
                           for s in range(self.n_shards)}, write=True)
        self._collections.pop(name, None)
        return self.collection(name)

    def drop_collection(self, name: str) -> None:
        self.backend.each({s: ("drop", name) for s in range(self.n_shards)}, write=True)
        self._collections.pop(name, None)

    def pids(self) -> list[list[int]]:
        """Per shard, per replica: the actor's process id (for tests and operators)."""
        if isinstance(self.backend, LocalShards):
            return [[os.getpid()] for _ in range(self.n_shards)]
        ray = self.backend.ray
        return [[ray.get(h.call.remote("ping"))[2] for h in hs] for hs in self.handles]

    def close(self) -> None:
        if isinstance(self.backend, LocalShards):
            self.backend.close()
            return
        ray = self.backend.ray
        # every follower at once, then every writer at once (a writer seals its buffer)
        for group in ([h for hs in self.handles for h in hs[1:]], [hs[0] for hs in self.handles]):
            refs = [h.call.remote("close") for h in group]
            for ref in refs:
                try:
                    ray.get(ref, timeout=60)
                except Exception:  # a dead replica has nothing to close
                    pass
            for h in group:
                ray.kill(h)
        if self._started_ray and not settings().keep_ray:
            ray.shutdown()
