"""A collection: the user-facing API over one manifest (query, add, get, delete, count)."""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from polyindex.config import CollectionConfig
from polyindex.errors import (
    Corrupt,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from polyindex.index.protocol import IndexKind
from polyindex.index.registry import from_factory
from polyindex.ingest import documents, quality
from polyindex.query.filters import compile_filter
from polyindex.query import vector_lane
from polyindex.query.pipeline import run
from polyindex.query.profiles import builtin_profiles, resolve_profile
from polyindex.query.requests import default_vector_profile, make_queries
from polyindex.storage import compaction, gc
from polyindex.storage.manifest import MANIFEST, load_manifest
from polyindex.storage.snapshot import OpenedSegment, Snapshot
from polyindex.storage.writer import Writer, writer_lock
from polyindex.types import MAX_K, Document, Hit

RECHECK_S = 0.05  # how stale a reader may be about commits made by other processes


class Collection:
    def __init__(self, folder: Path, device: str = "cpu", online: bool = False,
                 readonly: bool = False, dir_lock=None, follow_wal: bool = True):
        self.folder = folder
        # The engine's data-directory lock, kept alive while this handle can write (a
        # collection outliving its engine object must not let a second writer in).
        self._dir_lock = dir_lock
        self.online = online
        self.readonly = readonly
        self.name = folder.name
        self.device = device
        self.closed = False
        self._folder_id = _folder_id(folder)
        manifest = load_manifest(folder)
        self.config: CollectionConfig = manifest.config
        self.uid = self.config.uid
        # Keyed by index name: the kind ("dense", "lexical") or a named field ("dense@image").
        self.kinds: dict[str, IndexKind] = {}
        for factory in self.config.indexes:
            try:
                kind = from_factory(factory)
            except InvalidArgument as e:  # it was valid when the collection was created
                raise Corrupt(f"{folder / MANIFEST}: stored index {factory!r}: {e}") from e
            kind.attach(device=device, token_encoder=partial(
                _token_encoder, self.config.model, self.config.dtype, device))
            kind.load_artifacts(folder / "artifacts" / kind.artifact_name)
            self.kinds[kind.name] = kind
        for name, kind in self.kinds.items():  # dimensions taken from the first vectors
            if kind.kind == "dense" and kind.dim is None and manifest.segments:
                kind.dim = manifest.segments[0].indexes.get(name, {}).get("dim")
        self._tune_kinds()
        self._opened: dict[str, OpenedSegment] = {}
        self._tombstones: dict[str, np.ndarray] = {}
        self._lock = threading.RLock()  # the snapshot and the caches of opened files
        # Writers of this process, one at a time (with the folder's LOCK across processes);
        # not ``_lock``: a seal or merge commit never makes a query wait for a snapshot.
        self._write_lock = threading.RLock()
        self._snapshot: Snapshot | None = None
        self._stamp = None
        self._checked = 0.0
        self._encoder = None
        self._profiles: dict = {}
        self._manifest_path = str(folder / MANIFEST)
        # Files later commits stopped naming that a live snapshot still pinned (retried after
        # the next commit), and whether this writer has swept for a crash's leftovers yet.
        self._garbage: set[str] = set()
        self._swept = False
        self.merge_stats = {"merges": 0, "merge_failures": 0, "last_merge_error": None,
                            "rows_merged": 0, "rows_reclaimed": 0}
        self._online = None
        self._merger = None
        # A reader's view of the writer's acknowledged, not yet sealed writes (its WAL tail)
        self._follow_wal = readonly and follow_wal
        self._follower = None
        if online:
            from polyindex.online.merging import BackgroundMerger
            from polyindex.online.writes import OnlineWrites
            self._online = OnlineWrites(self)
            self._merger = BackgroundMerger.start_for(self)
        elif not readonly and _has_wal(folder):
            # Acknowledged online writes not yet sealed (the server stopped before sealing):
            # an offline writer seals them first, so nothing acknowledged is left unseen.
            from polyindex.online.writes import OnlineWrites
            OnlineWrites(self).close()

    # -- snapshots -------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """What queries see: the newest committed snapshot, plus, in online mode, the
        acknowledged writes not yet sealed."""
        if self.closed:
            raise NotFound(f"collection {self.name!r} was dropped or closed")
        online = self._online
        if online is not None:
            return online.snapshot()
        if self._follow_wal:
            return self._follow().snapshot()
        if self._snapshot is None or self.manifest_changed():
            return self.sealed_snapshot()
        return self._snapshot

    def manifest_changed(self) -> bool:
        """Has another writer committed? Checked at most every ``RECHECK_S`` (a stat per
        query is measurable); this process's own commits call ``refresh`` and show at once."""
        now = time.monotonic()
        if self._stamp is not None and now - self._checked < RECHECK_S:
            return False
        self._checked = now
        try:
            st = os.stat(self._manifest_path)
        except FileNotFoundError:
            raise NotFound(f"collection {self.name!r} was dropped") from None
        return (st.st_mtime_ns, st.st_size, st.st_ino) != self._stamp

    def is_current(self) -> bool:
        """Is this still the collection at its path (not dropped, not re-created)?"""
        return not self.closed and _folder_id(self.folder) == self._folder_id

    def sealed_snapshot(self) -> Snapshot:
        """The newest committed manifest's snapshot (re-read only when the file changed)."""
        with self._lock:
            try:
                st = os.stat(self._manifest_path)
            except FileNotFoundError:
                raise NotFound(f"collection {self.name!r} was dropped") from None
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if self._snapshot is None or stamp != self._stamp:
                for attempt in range(5):
                    try:
                        self._load_snapshot()
                        break
                    except Corrupt:
                        # A writer in another process committed and removed what our
                        # manifest named while we opened it: read the new manifest. Damage
                        # under an unchanged manifest is reported.
                        if attempt == 4 or not self._manifest_moved(stamp):
                            raise
                        stamp = self._manifest_stamp()
                self._stamp = stamp
            return self._snapshot

    def _manifest_stamp(self):
        st = os.stat(self._manifest_path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _manifest_moved(self, stamp) -> bool:
        try:
            return self._manifest_stamp() != stamp
        except FileNotFoundError:
            raise NotFound(f"collection {self.name!r} was dropped") from None

    def _load_snapshot(self) -> None:
        """Read the manifest and open what is new in it (under ``self._lock``)."""
        # A reader's failpoints are its own (``follow.*``): one process may hold a writer too
        point = "follow" if self.readonly else "snapshot"
        manifest = load_manifest(self.folder, f"{point}.manifest")
        if manifest.config.uid != self.uid:
            raise NotFound(f"collection {self.name!r} was dropped (and created again)")
        if manifest.config != self.config:  # e.g. train-ranker or tune-bm25 elsewhere
            self.config = manifest.config
            self._profiles.clear()
            self._tune_kinds()
        for kind in self.kinds.values():
            if manifest.artifacts.get(kind.artifact_name) and kind.needs_training():
                kind.load_artifacts(self.folder / "artifacts" / kind.artifact_name)
        self._snapshot = Snapshot.from_manifest(self.folder, manifest, self.kinds,
                                                self._opened, self._tombstones, point)
        # Segments and tombstone versions gone from the manifest (merged away,
        # replaced): older snapshots keep their own references; the caches let go.
        ids = {e.id for e in manifest.segments}
        for gone in [k for k in self._opened if k not in ids]:
            del self._opened[gone]
        names = {e.tombstones for e in manifest.segments}
        for gone in [k for k in self._tombstones if k not in names]:
            del self._tombstones[gone]

    def _follow(self):
        follower = self._follower
        if follower is None:
            from polyindex.online.follow import WalFollower
            with self._lock:
                if self._follower is None:
                    self._follower = WalFollower(self)
                follower = self._follower
        return follower

    def catch_up(self) -> None:
        """A reader: take in the writer's acknowledged writes now (not at the next check)."""
        if self._follow_wal and not self.closed:
            self._follow().catch_up(force=True)

    def refresh(self) -> None:
        self._stamp = None

    def _tune_kinds(self) -> None:
        """The lexical kind scores with the collection's tuned BM25 (``config.lexical_params``,
        from ``tune-bm25``), else with its factory string's."""
        lex = self.kinds.get("lexical")
        if lex is not None:
            factory = next(f for f in self.config.indexes if f.partition(":")[0].strip() == "lexical")
            lex.set_scorer(self.config.lexical_params or factory.partition(":")[2].strip())

    # -- encoding --------------------------------------------------------------------------
    @property
    def encoder(self):
        if self.config.model is None:
            raise InvalidArgument(f"collection {self.name!r} has no model (model=None): give "
                                  "vectors, not text, to the vector indexes")
        if self._encoder is None:
            from polyindex.encode.text import get_encoder
            self._encoder = get_encoder(self.config.model, self.config.dtype, self.device)
        return self._encoder

    def _encode_docs(self, texts, on_batch=None):
        return self.encoder.encode(texts, on_batch=on_batch)

    def _encode_docs_tokens(self, texts, on_batch=None):
        """(embeddings or None, per-document tokens) from one forward pass of the model."""
        from polyindex.encode.tokens import token_encoder_for
        salience = any(k.wants_salience for k in self.kinds.values())
        emb, tokens = token_encoder_for(self.encoder).encode_documents(
            texts, salience=salience, on_batch=on_batch)
        return (emb if any(k.needs_embeddings for k in self.kinds.values()) else None), tokens

    def document_encoder(self, device: str | None = None):
        """The writer's ``encode(texts, on_batch)``, or None when writes run no model;
        ``device``: where the model runs (a Ray encoder on a GPU), default the CPU."""
        if not self.encodes_text():
            return None
        if device not in (None, "cpu"):
            from polyindex.encode.text import get_encoder
            self._encoder = get_encoder(self.config.model, self.config.dtype, device)
        if any(k.needs_tokens for k in self.kinds.values()):
            return self._encode_docs_tokens
        return self._encode_docs

    # -- writes ----------------------------------------------------------------------------
    def vector_spec(self):
        """The vector fields the user fills (a fresh ``VectorSpec`` per write: dimensions not
        yet known are fixed by the write's first vector)."""
        from polyindex.ingest.vectors import VectorSpec
        return VectorSpec.of(self.kinds, self.config.model)

    def encodes_text(self) -> bool:
        """Whether writes run the collection's model (the unnamed field comes from text)."""
        return self.config.model is not None and \
            "dense" not in self.vector_spec().fields and \
            any(k.needs_embeddings or k.needs_tokens for k in self.kinds.values())

    @contextmanager
    def writer(self):
        if self.readonly:
            raise FailedPrecondition(f"collection {self.name!r} is open read-only")
        if self.closed:
            raise NotFound(f"collection {self.name!r} was dropped or closed")
        with self._write_lock, writer_lock(self.folder):
            w = Writer(self.folder, self.kinds, self.document_encoder(),
                       open_segment=self._opened_docs)
            if w.manifest.config.uid != self.uid:
                raise NotFound(f"collection {self.name!r} was dropped (and created again)")
            # Document quality where it is worth its cost: a collection that runs its model
            # on the text (~80 us a document beside ~50 ms of encoding; a lexical-only
            # ingest would be ~30% slower) or that prunes. Holds the folder, not the
            # collection: no reference cycle through the writer.
            if self.encodes_text() or w.manifest.config.prune_threshold is not None:
                w.quality = partial(quality.assess, self.folder)
            yield w
            self._collect(w)

    def _opened_docs(self, seg_id: str):
        opened = self._opened.get(seg_id)
        return opened.docs if opened is not None else None

    def collect_garbage(self) -> None:
        """Retry removing files left pinned at the last commit (a merge's sources, pinned by
        the snapshots that were serving until it was published); nothing to do: no lock."""
        if self._garbage and not self.readonly and not self.closed:
            with self.writer():
                pass  # the writer's exit collects

    def _collect(self, w: Writer) -> None:
        """Remove what this writer's commits stopped naming (and, the first time, what a
        crash left behind), unless a live snapshot pins it; under the writer's lock."""
        candidates = self._garbage | set(w.garbage)
        if not self._swept:
            candidates.update(gc.sweep(self.folder, w.manifest))
            self._swept = True
        if candidates:
            _, later = gc.remove(self.folder, sorted(candidates), w.manifest)
            self._garbage = set(later)

    def index(self, source, *, skip_invalid: bool = False, progress: bool = False,
              force: bool = False, prune_quality: float | None = None,
              quality_model: str | Path | None = None):
        """Bulk-index a source (path or Source); see ``polyindex.ingest.bulk.bulk_index``.

        ``prune_quality`` P in [0, 1): the fraction P of the input with the lowest quality
        estimate is kept out of the costly representations (dense, multivector, sparse,
        tree): not encoded, not in those indexes, still stored, returned by ``get`` and
        found by lexical queries. The threshold (a quantile of the input's qualities) is
        stored in the collection config and applied to every later write.
        ``quality_model``: a LightGBM text model to use instead of the shipped one, when the
        collection has none yet (``bench/train_quality.py``)."""
        from polyindex.ingest.bulk import bulk_index
        from polyindex.ingest.sources import Source, open_source
        from polyindex.rerank.doc_quality import check_fraction
        prune = None if prune_quality is None else check_fraction(prune_quality)
        src = source if isinstance(source, Source) else open_source(source)
        return bulk_index(self, src, skip_invalid=skip_invalid, progress=progress, force=force,
                          plan=partial(quality.plan, self.folder, self.name, prune=prune,
                                       model=quality_model))

    def add(self, docs: Iterable[Any], *, embeddings: np.ndarray | None = None) -> int:
        """Upsert documents (dicts or Documents) as one new segment; all or nothing.

        ``embeddings``: the collection model's embeddings of the documents, (n, d) float32 in
        their order (ids then must be unique), computed elsewhere (a sharded router encodes
        a batch once, as one node would, and sends each shard its rows)."""
        unique: dict[str, Document] = {}
        spec = self.vector_spec()
        for i, d in enumerate(docs):
            doc = documents.from_user(d, i, spec, self.config.fields)
            unique.pop(doc.id, None)
            unique[doc.id] = doc
        if not unique:
            return 0
        batch = list(unique.values())
        if embeddings is not None:
            embeddings = documents.check_embeddings(embeddings, batch, i + 1)
            if not self.encodes_text():
                embeddings = None  # nothing here reads model embeddings
        online = self._online  # read once: a concurrent drop sets it to None
        if online is not None:
            return online.upsert(batch, embeddings)
        with self.writer() as w:
            w.commit_segment(batch, self.config.fields, embeddings=embeddings,
                             vectors=spec.stack(batch) if spec else None)
        self.refresh()
        return len(unique)

    def delete(self, ids: Sequence[str]) -> int:
        ids = documents.check_ids(ids)
        online = self._online
        if online is not None:
            return online.delete(ids)
        with self.writer() as w:
            n = w.delete(ids)
        self.refresh()
        return n

    # -- reads -----------------------------------------------------------------------------
    def count(self) -> int:
        return self.snapshot().count()

    def get(self, ids: Sequence[str], *, with_vectors: bool = False) -> list[Document | None]:
        """Documents by id (None where absent); ``with_vectors`` adds each document's stored
        vectors (``Document.vectors``, by field: "dense" and the named fields)."""
        ids = documents.check_ids(ids)
        snap = self.snapshot()
        out: list[Document | None] = []
        for loc in snap.find(ids):
            doc = None if loc is None else snap.segments[loc[0]].docs.documents([loc[1]])[0]
            if doc is not None and with_vectors:
                seg = snap.segments[loc[0]]
                vecs = {k.field: seg.indexes[name].vectors(np.array([loc[1]]))[0].copy()
                        for name, k in self.kinds.items() if k.kind == "dense"}
                # an optional field the document left out reads back as NaN: absent here
                doc.vectors = {f: v for f, v in vecs.items() if not np.isnan(v[:1]).any()}
            out.append(doc)
        return out

    def _profile(self, profile):
        """Named profiles are parsed once and cached (their definitions never change)."""
        if isinstance(profile, dict):
            return resolve_profile(profile, list(self.kinds), self.config.profiles)
        if profile is not None and not isinstance(profile, str):
            raise InvalidArgument(f"profile must be a name or a dict, got {type(profile).__name__}")
        prof = self._profiles.get(profile)
        if prof is None:
            prof = self._profiles[profile] = resolve_profile(profile, list(self.kinds),
                                                             self.config.profiles)
        return prof

    def save_profile(self, name: str, profile: dict) -> None:
        """Store a rank profile with the collection (validated; replaces one of that name)."""
        from polyindex.config import validate_name
        from polyindex.query.profiles import Profile
        validate_name(name, "profile")
        Profile.from_json(name, profile, set(self.kinds))
        self.commit_metadata(profiles={name: profile})

    def artifact_dir(self, name: str) -> Path:
        """Folder for a collection-level artifact (e.g. a trained ranker) before it is committed."""
        from polyindex.config import validate_name
        folder = self.folder / "artifacts" / validate_name(name, "artifact")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def artifacts(self) -> dict[str, list[str]]:
        return dict(self.sealed_snapshot().manifest.artifacts)

    def commit_metadata(self, *, profiles: dict | None = None, artifacts: dict | None = None,
                        lexical_params: str | None = None) -> None:
        """Commit rank profiles, artifacts and/or the tuned lexical scorer in one version."""
        from polyindex.storage.fsutil import fsync_tree
        if lexical_params:  # validated and normalized before it is stored
            lexical_params = from_factory(f"lexical:{lexical_params}").body
        for name in artifacts or {}:
            fsync_tree(self.artifact_dir(name))
        with self.writer() as w:
            if lexical_params is not None:  # the writer commits a copy of its manifest
                from dataclasses import replace
                w.manifest = w.manifest.copy()
                w.manifest.config = replace(w.manifest.config, lexical_params=lexical_params)
            w.commit_metadata(profiles=profiles, artifacts=artifacts)
            self.config = w.manifest.config
        self._profiles.clear()
        self._tune_kinds()
        self.refresh()

    def profiles(self) -> dict[str, dict]:
        return {**builtin_profiles(list(self.kinds)), **self.config.profiles}

    def query(self, text: str | None = None, *, vector=None, using: str | None = None,
              tokens=None, k: int = 10, profile=None, filter: dict | None = None,
              explain: bool = False, with_text: bool = False,
              with_metadata: bool | None = None) -> list[Hit]:
        """``vector``: a list/array for the unnamed field (or the field ``using`` names), or a
        dict field -> vector (several named vectors; fused by ``profile``, by default RRF).
        ``tokens``: an (n_tokens, d) query matrix for a ``multivector:source=user`` index
        (alone, profile ``multivector`` by default).
        ``with_metadata`` (default: as ``with_text``) fills each hit's stored metadata."""
        vectors = None if vector is None else [vector]
        if vector_lane.plain_call(text, vectors, using, tokens, k, profile, filter, explain,
                                  with_text, with_metadata):
            # the plain nearest-neighbour call: the vector lane when the profile is one dense
            # stage (the same hits as the general path, a fraction of its Python)
            snap, plan = self._lane(profile, vector)
            if plan is not None:
                hits = plan.search(snap, vector, k)
                if hits is not None:
                    return hits
        return self.query_batch(None if text is None else [text], vectors=vectors, using=using,
                                tokens=None if tokens is None else [tokens],
                                k=k, profile=profile, filter=filter, explain=explain,
                                with_text=with_text, with_metadata=with_metadata)[0]

    def _lane(self, profile, vector):
        """(the snapshot, its vector-lane plan for ``profile``, or None: the general path)."""
        def resolve():
            name = profile if profile is not None else \
                default_vector_profile(make_queries(None, [vector]), None, self.kinds)
            return self._profile(name)
        snap = self.snapshot()
        return snap, vector_lane.plan(snap, profile, resolve)

    def query_batch(self, texts: Sequence[str] | None = None, *, vectors=None,
                    using: str | None = None, tokens=None, k: int = 10, profile=None,
                    filter: dict | None = None, explain: bool = False,
                    with_text: bool = False,
                    with_metadata: bool | None = None) -> list[list[Hit]]:
        """Run many queries through one profile; query-wide work is done once per batch."""
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise (ResourceExhausted if isinstance(k, int) and k > MAX_K else InvalidArgument)(
                f"k must be an integer in 1..{MAX_K}, got {k!r}")
        if vector_lane.plain_call(texts, vectors, using, tokens, k, profile, filter, explain,
                                  with_text, with_metadata):
            snap, plan = self._lane(profile, vectors[0])  # the vector lane, as in ``query``
            if plan is not None:
                hits = plan.search_batch(snap, vectors, k)
                if hits is not None:
                    return hits
        queries = make_queries(texts, vectors, using, tokens)
        if profile is None:
            profile = default_vector_profile(queries, using, self.kinds)
        prof = self._profile(profile)
        needs_vec = any(self.kinds[st.index].needs_embeddings for st in prof.retrieve)
        if needs_vec and any(q.vector is None for q in queries):
            missing = [i for i, q in enumerate(queries) if q.vector is None]
            vecs = self.encoder.encode([queries[i].text for i in missing], chunk=len(missing) or 1)
            for i, v in zip(missing, vecs):
                queries[i].vector = v
        expr = None if filter is None else compile_filter(filter, self.config.fields)
        return run(self.snapshot(), queries, prof, k, expr, explain, with_text, with_metadata)

    def info(self) -> dict:
        snap = self.snapshot()
        m = snap.manifest
        return {"name": self.name, "version": m.version, "documents": snap.count(),
                "segments": len(m.segments), "deleted_rows": sum(s.n_deleted for s in m.segments),
                "indexes": [k.describe() for k in self.kinds.values()],
                "profiles": sorted(self.profiles()), "model": self.config.model,
                "dtype": self.config.dtype, "segment_size": self.config.segment_size,
                "fields": self.config.fields,
                "vector_fields": {f.name: {"index": f.index, "dim": f.dim, "metric": f.metric}
                                  for f in self.vector_spec().fields.values()},
                "ingest": m.ingest, "format_version": m.format_version,
                **gc.disk_usage(self.folder, m),
                # merges this process made (a server's background merging, compact)
                **(self.merge_stats if self._merger is not None or self.merge_stats["merges"]
                   else {}),
                **(online.pending() if (online := self._online) is not None else {}),
                **(f.pending() if (f := self._follower) is not None else {})}

    # -- compaction ------------------------------------------------------------------------
    def merge(self, ids: Sequence[str], stop=lambda: False) -> dict | None:
        """Merge the segments ``ids`` into one (``storage.compaction.merge``)."""
        return compaction.merge(self, ids, stop)

    def compact(self, max_segments: int | None = None, on_merge=None) -> dict:
        """Merge until the policy (or ``max_segments``) is met and no deleted row is left;
        returns a report (``storage.compaction.compact``)."""
        return compaction.compact(self, max_segments, on_merge)

    def storage_report(self) -> dict:
        return compaction.storage_report(self)

    def seal(self) -> None:
        """Online mode: seal the buffered writes into a segment now."""
        online = self._online
        if online is not None:
            online.seal()

    def close(self) -> None:
        """Release resources; in online mode, seal what is buffered first."""
        online = self._online
        self._stop_merger()
        try:
            if online is not None:
                online.close()  # seals first: the collection is still open for that
        finally:
            self._online = None
            self.closed = True
            self._dir_lock = None  # this handle no longer keeps the directory's lock alive
            self._release()

    def _release(self) -> None:
        """Let go of opened segments: a closed handle pins no file against collection."""
        with self._lock:
            self._snapshot = None
            self._opened.clear()
            self._tombstones.clear()
            follower, self._follower = self._follower, None
        if follower is not None:
            follower.close()  # its private folder of buffer segments

    def abandon(self) -> None:
        """Close without sealing (the collection is being dropped): stops the sealer, waits
        for an in-flight seal, closes the WAL; every later call answers NotFound."""
        self._stop_merger()
        online, self._online = self._online, None
        self.closed = True
        self._dir_lock = None
        if online is not None:
            online.abandon()
        self._release()

    def _stop_merger(self) -> None:
        merger, self._merger = self._merger, None
        if merger is not None:
            merger.stop()  # an unfinished merge is abandoned: nothing of it committed


def _token_encoder(model: str, dtype: str, device: str = "cpu"):
    """The collection model's token encoder, for kinds that encode (multivector); a plain
    function, so the kinds hold no reference back to their collection."""
    from polyindex.encode.tokens import get_token_encoder
    return get_token_encoder(model, dtype, device)


def _has_wal(folder: Path) -> bool:
    wal = folder / "wal"
    return wal.is_dir() and any(p.stat().st_size for p in wal.glob("wal-*.log"))


def _folder_id(folder: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
