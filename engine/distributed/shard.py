"""One shard of a sharded collection: an ordinary data directory served by one process.

A ``Shard`` holds an :class:`~polyindex.engine.Engine` over its directory (the writer, or a
read-only replica following the writer's WAL) and answers the router's calls. It never ranks
across shards: it retrieves each stage's top k from its own rows with the collection-wide
term statistics the router gathered from every shard (``rerank.stats.TermTable``, installed
in the snapshot's cache under ``lexical.GLOBAL``), computes the segment-local rerank
features of its candidates, and stores what it is sent. The Ray actor (``serving``) is this
class under ``ray.remote``; tests also use it in-process.

Statistics and writes: a shard's content is named by its WAL sequence number (every write
of an online collection is one WAL record; seals and merges move rows without changing
them). ``retrieve`` says ``stale`` when its content is no longer the one its part of the
router's table was taken from, and the router refreshes the table and asks again.
"""
from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from polyindex.distributed.backends import LOST
from polyindex.index.lexical.kind import GLOBAL
from polyindex.types import Document

PINNED = 64  # snapshots kept for the features of queries in flight


class Shard:
    def __init__(self, path: str | Path, *, readonly: bool = False, shard: int = 0,
                 replica: int = 0):
        from polyindex.engine import Engine
        self.path, self.shard, self.replica = Path(path), shard, replica
        self.engine = Engine(path, online=not readonly, readonly=readonly)
        # collection -> (table version, TermTable, WAL seq of this shard's part of it)
        self._global: dict[str, tuple[int, object, int]] = {}
        self._local: dict[str, tuple[int, object]] = {}  # collection -> (WAL seq, own table)
        # Snapshots a ``retrieve`` answered from, by token, so the same query's ``features``
        # and ``kind_scores`` read the rows its keys name even when a seal or merge
        # publishes a new snapshot in between (the keys are rows of that snapshot). Bounded:
        # a pinned snapshot keeps its files from garbage collection.
        # Tokens name this replica too (a random prefix), so one another replica issued is
        # never taken for one of ours.
        self._pinned: OrderedDict[str, object] = OrderedDict()
        self._tokens = (f"{os.urandom(6).hex()}-{n}" for n in itertools.count(1))

    # -- content and statistics ----------------------------------------------------------
    def _current(self, name: str):
        """(collection, snapshot, WAL sequence number the snapshot includes), read as one:
        a write appends to the WAL and publishes its view under the view's lock, so a
        sequence number read apart from its snapshot could name a write the snapshot lacks
        (and label a term table with content it was not taken from)."""
        coll = self.engine.collection(name)
        snap = coll.view()  # catches up (a follower) or re-bases first, outside the lock
        live = coll.live.writes or coll.live.follower
        if live is None:
            return coll, snap, _wal_seq(coll)
        with live.lock:
            return coll, live.view, _wal_seq(coll)

    def table(self, name: str) -> tuple[int, object]:
        """(WAL seq, this shard's own term statistics) for the router's collection-wide sum."""
        from polyindex.rerank.stats import local_table
        coll, snap, seq = self._current(name)
        got = self._local.get(name)
        if got is None or got[0] != seq:  # no lexical kind: no term statistics to sum
            got = self._local[name] = (seq, local_table(snap) if "lexical" in coll.kinds
                                       else None)
        return got

    def install(self, name: str, version: int, table, seq: int) -> None:
        """The collection-wide table (version ``version``) built from this shard's part at
        ``seq``."""
        self._global[name] = (version, table, seq)

    def _with_global(self, name: str, version: int):
        """(collection, snapshot with the global table in its cache, stale?)."""
        coll, snap, seq = self._current(name)
        got = self._global.get(name)
        if got is None:
            return coll, snap, True
        installed, table, at = got
        lex = snap.cache.get("lexical")
        if lex is not None and lex.get(GLOBAL) is not table:
            snap.cache["lexical"] = {GLOBAL: table}  # nothing computed from local numbers stays
        return coll, snap, installed != version or at != seq

    # -- queries ---------------------------------------------------------------------------
    def retrieve(self, name: str, queries, profile, ks: list[int], filter_expr,
                 version: int) -> dict:
        """Each retrieve stage's top ``ks[i]`` of this shard: per stage (scores, local keys)
        and the ids of those keys; ``stale``: the statistics used are not this content's."""
        from polyindex.query.filters import compile_filter
        from polyindex.query.pipeline import allow_masks, retrieve
        coll, snap, stale = self._with_global(name, version)
        if stale and name not in self._global:
            return {"stale": True}
        prof = coll._profile(profile)
        expr = None if filter_expr is None else compile_filter(filter_expr, coll.config.fields)
        allow = allow_masks(snap, expr)
        stages, ids = [], []
        for st, k in zip(prof.retrieve, ks):
            scores, keys = retrieve(snap, queries, st.index, k, st.params, allow)
            stages.append((scores, keys))
            valid = keys[keys >= 0]  # row-major: the router pairs them again the same way
            ids.append(snap.ids_of(valid) if len(valid) else [])
        token = next(self._tokens)
        self._pinned[token] = snap
        while len(self._pinned) > PINNED:
            self._pinned.popitem(last=False)
        return {"stale": stale, "stages": stages, "ids": ids, "snapshot": token}

    def _snapshot_of(self, name: str, token: str | None):
        """The snapshot ``retrieve`` answered ``token`` from (unpinned: one rerank call per
        query reads it); None when it is not held (evicted, or another replica's token): the
        keys would name other rows, so the router asks again from the retrieve. No token:
        the current snapshot."""
        if token is None:
            return self._current(name)[1]
        return self._pinned.pop(token, None)

    def features(self, name: str, queries, keys: list[np.ndarray], version: int,
                 dense: bool, token: str | None = None):
        """Segment-local rerank features of candidates (per query, this shard's local keys,
        rows of the snapshot ``retrieve`` gave ``token``), and their stored embeddings when
        ``dense``, for the router's window; ``LOST`` when that snapshot is not held."""
        from polyindex.rerank import features
        _, _, stale = self._with_global(name, version)
        snap = self._snapshot_of(name, token)  # ``retrieve`` gave it the global statistics
        if snap is None:
            return LOST
        X, _ = features.compute_local(snap, queries, keys)
        flat = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        vecs = features.stored_vectors(snap, flat) if dense and len(flat) else None
        return {"stale": stale, "X": X, "vectors": vecs}

    def kind_scores(self, name: str, queries, keys: list[np.ndarray], spec: dict,
                    token: str | None = None):
        """A kind's own score of candidates (per query, local keys of ``token``'s snapshot;
        a profile's ``rerank: {"index": ...}``), NaN where it has none; ``LOST`` as
        ``features``."""
        from polyindex.rerank.kind_scores import raw_scores
        snap = self._snapshot_of(name, token)
        if snap is None:
            return LOST
        return raw_scores(snap, queries, keys, spec)

    def describe(self, name: str) -> dict:
        """What the router needs to know of the collection (the same on every shard)."""
        from polyindex.rerank import features
        coll = self.engine.collection(name)
        kinds = coll.kinds
        return {"model": coll.config.model, "dtype": coll.config.dtype,
                "fields": dict(coll.config.fields),
                "config_profiles": dict(coll.config.profiles), "kinds": dict(kinds),
                "feature_names": list(features.names(coll.view())),
                "encodes_text": coll.encoding.encodes_text()}

    def ranker(self, name: str, model: str) -> tuple[str, dict]:
        """The ranker a profile names, as (LightGBM model text, metadata)."""
        from polyindex.rerank import registry
        r = registry.resolve(self.engine.collection(name).view(), model)
        return r.booster.model_to_string(), r.meta

    # -- reads and writes ------------------------------------------------------------------
    def share_quality(self, name: str, texts: list[str]) -> bool:
        """Commit the collection's document-quality language model of ``texts`` (the
        router's first batch, sent to every shard) unless it has one; as one node, only
        where quality is computed (a collection that runs its model on the text, or prunes)."""
        from polyindex.ingest.quality import share
        coll = self.engine.collection(name)
        if not coll.encoding.encodes_text() and coll.config.prune_threshold is None:
            return False
        with coll.table.writer() as w:
            shared = share(coll.table.folder, w, texts)
        coll.table.refresh()
        return shared

    def train_shared(self, name: str, docs: list[Document], embeddings,
                     everything: bool = True) -> dict:
        """Train the collection's artifacts on ``docs`` (the router's first batch, whole) unless
        it has them; answers as bytes, for the other shards, every trained one
        (``everything``: a router's first call) or those trained now
        (``storage.shared_training``: one projector, one IVF template, for every shard), and
        the kinds still untrained (too few vectors in the batch)."""
        from polyindex.storage.shared_training import export, train_first, untrained
        coll = self.engine.collection(name)
        spec = coll.encoding.vector_spec()
        now = train_first(coll.table, docs,
                          None if embeddings is None else np.asarray(embeddings),
                          spec.stack(docs) if spec else None)
        return {"blobs": export(coll.table, None if everything else now),
                "untrained": untrained(coll.table.kinds)}

    def install_shared(self, name: str, blobs: dict) -> list[str]:
        """Commit the artifacts shard 0 trained (``train_shared``) unless this shard has its
        own already."""
        from polyindex.storage.shared_training import install
        return install(self.engine.collection(name).table, blobs)

    def add(self, name: str, docs: list[Document], embeddings) -> int:
        return self.engine.collection(name).add(docs, embeddings=embeddings)

    def delete(self, name: str, ids: list[str]) -> int:
        return self.engine.collection(name).delete(ids)

    def get(self, name: str, ids: list[str], with_vectors: bool = False) -> list:
        return self.engine.collection(name).get(ids, with_vectors=with_vectors)

    def count(self, name: str, filter: dict | None) -> int:
        return self.engine.collection(name).count(filter)

    def delete_where(self, name: str, filter: dict) -> int:
        return self.engine.collection(name).delete_where(filter)

    def scroll(self, name: str, filter, limit: int, cursor, fields, with_vectors: bool):
        return self.engine.collection(name).scroll(filter=filter, limit=limit, cursor=cursor,
                                                   fields=fields, with_vectors=with_vectors)

    def payload(self, name: str, ids: list[str]) -> list:
        """Stored documents of hits (title, text, metadata), by id."""
        return self.engine.collection(name).get(ids)

    def info(self, name: str) -> dict:
        return self.engine.collection(name).info()

    def create(self, name: str, indexes, kw: dict) -> None:
        self.engine.create_collection(name, indexes, **kw)

    def drop(self, name: str) -> None:
        self.engine.drop_collection(name)
        self._global.pop(name, None)
        self._local.pop(name, None)

    def names(self) -> list[str]:
        return self.engine.list_collections()

    def seal(self, name: str) -> None:
        self.engine.collection(name).seal()

    def catch_up(self, name: str) -> None:
        """A follower replica: take in its writer's acknowledged writes now."""
        self.engine.collection(name).catch_up()

    def ping(self) -> tuple[int, int, int]:
        import os
        return self.shard, self.replica, os.getpid()

    def close(self) -> None:
        self.engine.close()


def _wal_seq(coll) -> int:
    """The WAL sequence number of the last write a collection's current view includes."""
    online = coll.live.writes
    if online is not None:
        return int(online.wal.last_seq)
    follower = coll.live.follower
    if follower is not None:
        return int(follower.pending()["wal_seq"])
    return int(coll.table.sealed_snapshot().manifest.wal_through)
