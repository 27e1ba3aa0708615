"""The router of a sharded collection: writes to the shard that owns each id, queries fanned
out to every shard and merged into the one-node answer.

A query runs the profile's phases once, globally, with each shard doing its segment-local
part:

1. the query text is encoded here, once (shards never run the model at query time);
2. every shard retrieves each stage's top k of its rows, scored with the collection-wide
   term statistics (``rerank.stats.TermTable``: the sum of every shard's, refreshed when a
   shard's content moved past the part it contributed; see ``shard``);
3. per stage the shards' lists are merged by (score, key): each shard's top k holds every
   row of the global top k it owns, so the merge is the one-node top k;
4. fusion and the window cut run here on those global lists;
5. a LightGBM rerank asks each shard for its candidates' segment-local features (lexical,
   kinds' scores) and stored embeddings, fills the window's dense and fusion features here,
   and scores the window once; a kind's rerank (``{"index": ...}``) asks for raw scores.

Keys here are ``shard << SHIFT | local key``; equal scores are put in id order, here as on
one node (``index/ties``). A query's rerank calls go to the replica whose snapshot its
retrieve read (the keys are that snapshot's rows); a replica lost in between makes the query
run again. ``backend`` gives the shards (``serving.RayShards``, or in-process
``LocalShards``); a shard none of whose replicas answers fails the query with UNAVAILABLE,
unless the call allows partial results, which then name the shards left out.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
import xxhash

from polyindex.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from polyindex.index.ties import cut_ties, order_ties
from polyindex.query.pipeline import explain_hits, fuse
from polyindex.query.profiles import Profile, builtin_profiles, resolve_profile
from polyindex.query.requests import default_vector_profile, make_queries
from polyindex.distributed import router_data
from polyindex.distributed.backends import LOST
from polyindex.types import (MAX_K, Hit, HitLists, Page, Ranking, check_fields, document_text,
                             select_fields)
from polyindex.wire.grpc_errors import Unavailable

SHIFT = 40  # local keys (rows of a shard's snapshot) stay below 2**40
STALE_RETRIES = 1  # after a refresh, an answer still racing a write is taken as it is
LOST_RETRIES = 2  # a query whose rerank lost its retrieve's replica runs again


def shard_of(doc_id: str, n_shards: int) -> int:
    """The shard that owns an id: a stable 64-bit hash (xxh64) of its UTF-8 bytes."""
    return xxhash.xxh64_intdigest(doc_id.encode()) % n_shards


class ShardedCollection:
    def __init__(self, name: str, backend):
        self.name, self.backend = name, backend
        self.n_shards = backend.n_shards
        self._lock = threading.Lock()
        self._version = 0  # of the collection-wide statistics the shards hold
        self._described: dict | None = None
        self._encoder = None
        self._rankers: dict[str, object] = {}
        self._quality_shared = False  # this router sent its first batch's language model
        self._trained = False  # every shard holds the collection's trained artifacts
        self._shipped = False  # this router sent shard 0's trained artifacts to every shard

    # -- what the collection is ------------------------------------------------------------
    def describe(self) -> dict:
        if self._described is None:
            self._described = self.backend.one("describe", self.name)
        return self._described

    @property
    def kinds(self) -> dict:
        """Name -> the collection's index kind objects (shard 0's, pickled)."""
        return self.describe()["kinds"]

    @property
    def config(self):
        return _Config(self.describe())

    def profiles(self) -> dict:
        return {**builtin_profiles(list(self.kinds)), **self.describe()["config_profiles"]}

    def vector_spec(self):
        from polyindex.ingest.vectors import VectorSpec
        return VectorSpec.of(self.kinds, self.describe()["model"])

    # -- writes ----------------------------------------------------------------------------
    def add(self, docs, *, embeddings=None) -> int:
        """Upsert: the batch is encoded here once (as one node encodes it) and each shard is
        sent its documents with their embeddings; shards commit independently."""
        from polyindex.ingest.documents import from_user
        spec, fields = self.vector_spec(), self.describe()["fields"]
        unique: dict = {}
        for i, d in enumerate(docs):  # checked whole here: no shard commits a bad batch's part
            doc = from_user(d, i, spec, fields)
            unique.pop(doc.id, None)
            unique[doc.id] = doc
        batch = list(unique.values())
        if not batch:
            return 0
        if embeddings is None and self.describe()["encodes_text"]:
            embeddings = self.encoder.encode([document_text(d.title, d.text) for d in batch])
        if not self._quality_shared:  # one language model for every shard (see ``shard``)
            texts = [document_text(d.title, d.text) for d in batch]
            self.backend.each({s: ("share_quality", self.name, texts)
                               for s in range(self.n_shards)}, write=True)
            self._quality_shared = True
        if not self._trained:
            self._share_training(batch, embeddings)
        parts: dict[int, list[int]] = {}
        for i, d in enumerate(batch):
            parts.setdefault(shard_of(d.id, self.n_shards), []).append(i)
        calls = {s: ("add", self.name, [batch[i] for i in rows],
                     None if embeddings is None else np.asarray(embeddings)[rows])
                 for s, rows in parts.items()}
        return sum(self.backend.each(calls, write=True).values())

    def _share_training(self, batch, embeddings) -> None:
        """Before any shard writes: the kinds that train a collection-level artifact (sparse
        projector, IVF/PQ template) train it once, in shard 0, on this batch whole (as one
        node trains on its first batch), and every other shard installs the same files
        (``storage.shared_training``). Once per router (a shard that has them keeps them);
        again on the next batch while a kind could not train (too few vectors)."""
        got = self.backend.each({0: ("train_shared", self.name, batch,
                                     None if embeddings is None else np.asarray(embeddings),
                                     not self._shipped)}, write=True)[0]
        self._shipped = True
        if self.n_shards > 1 and got["blobs"]:
            self.backend.each({s: ("install_shared", self.name, got["blobs"])
                               for s in range(1, self.n_shards)}, write=True)
        self._described = None  # the kinds now carry what they trained
        self._trained = not got["untrained"]

    def delete(self, ids: Sequence[str]) -> int:
        from polyindex.ingest.documents import check_ids
        ids = check_ids(ids)  # as one node: a bare string is refused, not split into ids
        parts: dict[int, list[str]] = {}
        for i in ids:
            parts.setdefault(shard_of(i, self.n_shards), []).append(i)
        calls = {s: ("delete", self.name, part) for s, part in parts.items()}
        return sum(self.backend.each(calls, write=True).values())

    def delete_where(self, filter: dict) -> int:
        return router_data.delete_where(self, filter)

    def scroll(self, *, filter: dict | None = None, limit: int = 100, cursor: str | None = None,
               fields: Sequence[str] | None = None, with_vectors: bool = False) -> Page:
        return router_data.scroll(self, filter, limit, cursor, fields, with_vectors)

    def get(self, ids: Sequence[str], *, with_vectors: bool = False,
            fields: Sequence[str] | None = None) -> list:
        from polyindex.ingest.documents import check_ids
        ids, fields = list(check_ids(ids)), check_fields(fields)
        parts: dict[int, list[int]] = {}
        for n, i in enumerate(ids):
            parts.setdefault(shard_of(i, self.n_shards), []).append(n)
        got = self.backend.each({s: ("get", self.name, [ids[n] for n in rows], with_vectors)
                                 for s, rows in parts.items()})
        out: list = [None] * len(ids)
        for s, rows in parts.items():
            for n, doc in zip(rows, got[s]):
                if doc is not None:
                    doc.metadata = select_fields(doc.metadata, fields)
                out[n] = doc
        return out

    def count(self, filter: dict | None = None) -> int:
        if filter is not None:
            return router_data.count(self, filter)
        return sum(i["documents"] for i in self._infos())

    def _infos(self) -> list[dict]:
        got = self.backend.each({s: ("info", self.name) for s in range(self.n_shards)})
        return [got[s] for s in range(self.n_shards)]

    def info(self) -> dict:
        """One node's ``info`` (the config from shard 0, counts and sizes summed; ``version``
        the sum of the shards' manifest versions, which grows with every commit), plus the
        shards' own."""
        infos = self._infos()
        out = {**infos[0], "name": self.name, "shards": self.n_shards,
               "replicas": self.backend.n_replicas}
        for key in ("version", "documents", "segments", "deleted_rows", "bytes", "wal_bytes"):
            out[key] = sum(int(i.get(key) or 0) for i in infos)
        out["per_shard"] = infos
        return out

    def adapt(self, *, revert: bool = False, recipe: dict | None = None) -> dict:
        """Not for a sharded collection: each shard holds a part of the corpus, and one
        encoder for every shard would have to learn from all of them and commit on all at
        one point (a coordinated commit across shards), which the router does not do."""
        raise FailedPrecondition(
            f"collection {self.name!r} is sharded: adapt is not supported for sharded "
            "collections (one encoder must learn from every shard's documents and be committed "
            "on all shards at once; each shard adapted alone would get its own encoder and "
            "scores no longer comparable across shards)")

    def snapshot(self, path: str) -> dict:
        """Not for a sharded collection yet: one consistent cut needs every shard sealed at
        one point (a coordinated seal across shards), which the router does not do."""
        raise FailedPrecondition(
            f"collection {self.name!r} is sharded: snapshots are not supported for sharded "
            "collections (a cut consistent across shards needs a coordinated seal); snapshot "
            "each shard's data directory with the server stopped (`polyindex snapshot create "
            "--data DATA/shard-NNN --collection NAME --to PATH`)")

    def seal(self) -> None:
        self.backend.each({s: ("seal", self.name) for s in range(self.n_shards)}, write=True)

    def catch_up(self) -> None:
        """Every replica takes in its writer's acknowledged writes now (they follow by
        themselves too, on their next read): a read after this sees every write acknowledged
        before it, whichever replica answers."""
        self.backend.broadcast({s: ("catch_up", self.name) for s in range(self.n_shards)})

    # -- queries ---------------------------------------------------------------------------
    @property
    def encoder(self):
        if self._encoder is None:
            d = self.describe()
            if d["model"] is None:
                raise InvalidArgument(f"collection {self.name!r} has no model (model=None): "
                                      "give vectors, not text, to the vector indexes")
            from polyindex.encode.text import get_encoder
            self._encoder = get_encoder(d["model"], d["dtype"])
        return self._encoder

    def query(self, text: str | None = None, *, vector=None, using: str | None = None,
              tokens=None, k: int = 10, profile=None, filter: dict | None = None,
              explain: bool = False, with_text: bool = False,
              with_metadata: bool | None = None, fields: Sequence[str] | None = None
              ) -> list[Hit]:
        return self.query_batch(None if text is None else [text],
                                vectors=None if vector is None else [vector], using=using,
                                tokens=None if tokens is None else [tokens], k=k,
                                profile=profile, filter=filter, explain=explain,
                                with_text=with_text, with_metadata=with_metadata,
                                fields=fields)[0]

    def query_ids(self, text: str | None = None, *, vector=None, using: str | None = None,
                  tokens=None, k: int = 10, profile=None, filter: dict | None = None) -> Ranking:
        """``query``'s ids and scores as arrays (``types.Ranking``)."""
        return Ranking.of(self.query(text, vector=vector, using=using, tokens=tokens, k=k,
                                     profile=profile, filter=filter))

    def query_batch(self, texts: Sequence[str] | None = None, *, vectors=None,
                    using: str | None = None, tokens=None, k: int = 10, profile=None,
                    filter: dict | None = None, explain: bool = False,
                    with_text: bool = False, with_metadata: bool | None = None,
                    fields: Sequence[str] | None = None,
                    allow_partial: bool = False) -> HitLists:
        if (fields := check_fields(fields)) is not None:
            with_metadata = True
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise (ResourceExhausted if isinstance(k, int) and k > MAX_K else InvalidArgument)(
                f"k must be an integer in 1..{MAX_K}, got {k!r}")
        queries = make_queries(texts, vectors, using, tokens)
        if profile is None:
            profile = default_vector_profile(queries, using, self.kinds)
        prof = self._profile(profile)
        if any(self.kinds[st.index].needs_embeddings for st in prof.retrieve):  # as one node
            missing = [i for i, q in enumerate(queries) if q.vector is None and q.text]
            if missing:
                vecs = self.encoder.encode([queries[i].text for i in missing],
                                           chunk=len(missing))
                for i, v in zip(missing, vecs):
                    queries[i].vector = v
        single = len(prof.retrieve) == 1 and prof.rerank is None
        ks = [k if single else st.k for st in prof.retrieve]
        for attempt in range(LOST_RETRIES + 1):
            answers, down, used = self._retrieve(queries, profile, ks, filter, allow_partial)
            stage_lists, ids = self._merge(answers, ks, len(queries))
            keep = max(k, prof.rerank["window"]) if prof.rerank else k
            per_query = [[(s[qi], kk[qi]) for s, kk in stage_lists]
                         for qi in range(len(queries))]
            fused = [(*fuse(prof, lists, keep), None) for lists in per_query]
            if prof.rerank is None:
                break
            window = prof.rerank["window"]
            cands = [(kk[:window], sc[:window]) for kk, sc, _ in fused]
            # the replica and snapshot each shard's retrieve read: the keys are its rows
            pins = {s: (used[s], a.get("snapshot")) for s, a in answers.items()}
            fused = self._rerank(queries, prof, cands, stage_lists, pins, explain)
            if fused is not None:
                break
        else:
            raise Unavailable(f"collection {self.name!r}: a shard's replica was lost between "
                              f"retrieve and rerank {LOST_RETRIES + 1} times")
        out = HitLists(self._hits(kk[:k], sc[:k], ids) for kk, sc, _ in fused)
        if explain:  # the merged lists explained as one node's (no kind's own account)
            for hits, lists, (kk, _, details) in zip(out, per_query, fused):
                explain_hits(prof, lists, hits, kk[:k], None if details is None
                             else details[:k])
        if with_text or with_metadata:
            self._payload(out, with_text, with_text if with_metadata is None else with_metadata,
                          fields)
        out.unavailable_shards = tuple(down)
        return out

    def _profile(self, profile) -> Profile:
        """As ``Collection._profile`` (the shards resolve the same name the same way)."""
        if profile is not None and not isinstance(profile, (str, dict)):
            raise InvalidArgument(f"profile must be a name or a dict, got {type(profile).__name__}")
        return resolve_profile(profile, list(self.kinds), self.describe()["config_profiles"])

    def _retrieve(self, queries, spec, ks, filter_expr, allow_partial):
        """Every shard's stage lists, with statistics current for the content they saw."""
        for attempt in range(STALE_RETRIES + 2):
            version = self._version
            calls = {s: ("retrieve", self.name, queries, spec, ks, filter_expr, version)
                     for s in range(self.n_shards)}
            got, used = self.backend.each(calls, allow_partial=allow_partial, replicas=True)
            down = sorted(s for s in range(self.n_shards) if got.get(s) is None)
            answers = {s: a for s, a in got.items() if a is not None}
            complete = all("stages" in a for a in answers.values())
            stale = any(a["stale"] for a in answers.values())
            if complete and (not stale or attempt >= STALE_RETRIES):
                return answers, down, used
            self.refresh_statistics(version, allow_partial)
        raise Unavailable(f"collection {self.name!r}: a shard has no collection-wide "
                          "statistics after refreshing them twice")

    def refresh_statistics(self, seen: int | None = None, allow_partial: bool = False) -> None:
        """Gather every shard's term table, sum them and hand the sum to every replica."""
        from polyindex.rerank.stats import TermTable
        with self._lock:
            if seen is not None and self._version != seen:  # another query refreshed it
                return
            parts = self.backend.each({s: ("table", self.name) for s in range(self.n_shards)},
                                      allow_partial=allow_partial)
            parts = {s: p for s, p in parts.items() if p is not None}
            tables = [p[1] for p in parts.values()]  # None: the collection has no lexical
            total = TermTable.merge(tables) if all(t is not None for t in tables) else None
            self.backend.broadcast({s: ("install", self.name, self._version + 1, total, p[0])
                                    for s, p in parts.items()})
            self._version += 1

    @staticmethod
    def _merge(answers: dict, ks: list[int], nq: int):
        """Per stage, the global (scores, keys) of each query's top k; and the ids of keys."""
        ids = _Ids(answers)
        out = []
        for st, k in enumerate(ks):
            parts_s, parts_k = [], []
            for s, a in answers.items():
                scores, keys = a["stages"][st]
                parts_s.append(scores)
                parts_k.append(np.where(keys >= 0, keys + (np.int64(s) << SHIFT), -1))
            if not parts_s:
                out.append((np.full((nq, 0), -np.inf, np.float32), np.full((nq, 0), -1)))
                continue
            scores = np.concatenate(parts_s, axis=1)
            keys = np.concatenate(parts_k, axis=1)
            scores = np.where(keys >= 0, scores, -np.inf)
            big = np.where(keys >= 0, keys, np.iinfo(np.int64).max)
            top = np.lexsort((big, -scores), axis=1)
            # each shard's list holds its top k by (score, id), a run at its k-th place cut
            # by id too (``pipeline``), so the merged cut by id is one node's
            scores, keys = cut_ties(np.take_along_axis(scores, top, 1),
                                    np.take_along_axis(keys, top, 1), k, ids)
            keys = order_ties(scores, keys, ids)
            out.append((scores, keys))
        return out, ids

    def _rerank(self, queries, prof, cands, stage_lists, pins: dict, explain: bool = False):
        """Per query (keys, scores, details or None), or None when a shard lost the snapshot;
        ``pins``: per shard, (the replica its retrieve read, the snapshot's token): the
        candidates' keys are rows of that snapshot, so the rerank calls go there."""
        spec = prof.rerank
        by_shard = _split(cands, self.n_shards)
        at = {s: pins[s][0] for s in by_shard}
        if "index" in spec:  # one kind's own score: exact per candidate, merged here
            from polyindex.rerank.kind_scores import order_by
            got = self.backend.each({s: ("kind_scores", self.name, queries, loc, spec,
                                         pins[s][1]) for s, (loc, _) in by_shard.items()},
                                    at=at)
            if any(isinstance(g, str) and g == LOST for g in got.values()):
                return None
            scores = _gather(cands, by_shard, {s: g for s, g in got.items()}, np.float32)
            return order_by(cands, scores, spec, explain)
        from polyindex.rerank import features, schema, stage
        ranker = self._ranker(spec["model"])
        if ranker.falls_back():  # as one node: the fused order, no features computed
            return [(np.asarray(kk), ranker.prior_weight * np.asarray(sc, np.float64), None)
                    for kk, sc in cands]
        names = self.describe()["feature_names"]
        ranker.check_names(names)
        dense = "dense" in self.kinds
        got = self.backend.each({s: ("features", self.name, queries, loc, self._version, dense,
                                     pins[s][1]) for s, (loc, _) in by_shard.items()}, at=at)
        if any(isinstance(g, str) and g == LOST for g in got.values()):
            return None
        X = _gather(cands, by_shard, {s: g["X"] for s, g in got.items()}, np.float32)
        qptr = np.concatenate([[0], np.cumsum([len(kk) for kk, _ in cands])]).astype(np.int64)
        if len(X):
            keys = np.concatenate([np.asarray(kk, np.int64) for kk, _ in cands])
            if dense:
                vecs = _gather(cands, by_shard, {s: g["vectors"] for s, g in got.items()},
                               np.float32)
                features.dense_features(vecs, queries, qptr, X)
            per_query = [[(s[qi], kk[qi]) for s, kk in stage_lists] for qi in range(len(queries))]
            features.fusion_features(keys, per_query, [st.index for st in prof.retrieve], qptr, X)
            X[:, schema.INDEX["fused_score"]] = np.concatenate(
                [np.asarray(sc, np.float32) for _, sc in cands])
        return stage.order(ranker, X, qptr, cands, names, explain)

    def _ranker(self, model: str):
        ranker = self._rankers.get(model)
        if ranker is None:
            import lightgbm as lgb
            from polyindex.rerank.ltr import Ranker
            text, meta = self.backend.one("ranker", self.name, model)
            ranker = self._rankers[model] = Ranker(lgb.Booster(model_str=text), meta,
                                                  f"ranker {model!r}")
        return ranker

    @staticmethod
    def _hits(keys, scores, ids) -> list[Hit]:
        return [Hit(i, float(sc), r)
                for r, (i, sc) in enumerate(zip(ids(keys), scores.tolist()), 1)]

    def _payload(self, results, with_text: bool, with_metadata: bool, fields=None) -> None:
        hits = [h for hs in results for h in hs]
        docs = self.get([h.id for h in hits], fields=fields)
        for h, doc in zip(hits, docs):
            if doc is None:  # deleted since the query read it
                continue
            if with_text:
                h.title, h.text = doc.title, doc.text
            if with_metadata:
                h.metadata = doc.metadata


class _Ids:
    """Router keys -> ids, from the ids each shard sent with its stage lists (looked up only
    for the keys asked: hits and tie runs, not every candidate)."""

    def __init__(self, answers: dict):
        self.by_shard = {}
        for s, a in answers.items():
            keys = np.concatenate([kk[kk >= 0] for _, kk in a["stages"]]) if a["stages"] \
                else np.zeros(0, np.int64)
            names = [i for part in a["ids"] for i in part]
            uniq, first = np.unique(keys, return_index=True)
            self.by_shard[s] = (uniq, first, names)

    def __call__(self, keys) -> list[str]:
        keys = np.asarray(keys, np.int64)
        out: list = [None] * len(keys)
        shard = keys >> SHIFT
        for s in np.unique(shard).tolist():
            at = np.flatnonzero(shard == s)
            uniq, first, names = self.by_shard[s]
            pos = first[np.searchsorted(uniq, keys[at] - (np.int64(s) << SHIFT))]
            for p, n in zip(at.tolist(), pos.tolist()):
                out[p] = names[n]
        return out


class _Config:
    """The parts of a collection's config the service reads (``config.fields``)."""

    def __init__(self, described: dict):
        self.fields = described["fields"]
        self.model = described["model"]
        self.dtype = described["dtype"]


def _split(cands, n_shards: int) -> dict[int, tuple[list[np.ndarray], list[np.ndarray]]]:
    """Per shard: per query, the local keys of its candidates and their positions."""
    out: dict[int, tuple[list, list]] = {}
    for qi, (kk, _) in enumerate(cands):
        kk = np.asarray(kk, np.int64)
        shard = kk >> SHIFT
        for s in range(n_shards):
            if s not in out:
                out[s] = ([], [])
            pos = np.flatnonzero(shard == s)
            out[s][0].append(kk[pos] - (np.int64(s) << SHIFT))
            out[s][1].append(pos)
    return {s: v for s, v in out.items() if any(len(p) for p in v[1])}


def _gather(cands, by_shard, rows_of: dict, dtype) -> np.ndarray:
    """Shards' rows (per shard, its candidates' rows query by query) in window order."""
    counts = [len(kk) for kk, _ in cands]
    qptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    first = next((r for r in rows_of.values() if r is not None and len(r)), None)
    width = () if first is None or first.ndim == 1 else (first.shape[1],)
    out = np.full((int(qptr[-1]), *width), np.nan, dtype)
    for s, (_, positions) in by_shard.items():
        rows = rows_of[s]
        at = 0
        for qi, pos in enumerate(positions):
            out[qptr[qi] + pos] = rows[at:at + len(pos)]
            at += len(pos)
    return out
