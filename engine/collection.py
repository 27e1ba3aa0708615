"""A collection: the user-facing API (query, add, get, delete, count) over its storage table
(``storage.table.Table``), with the online writer, its background merger or a reader's WAL
follower composed over that table here."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from polyindex.errors import InvalidArgument, NotFound, ResourceExhausted
from polyindex.ingest import documents
from polyindex.ingest.encoding import Encoding, token_encoder
from polyindex.ingest.export import export as export_parquet
from polyindex.online.live import Live
from polyindex.query.filters import compile_filter
from polyindex.query import scan, vector_lane
from polyindex.query.pipeline import run
from polyindex.query.profiles import builtin_profiles, model_inputs, resolve_profile
from polyindex.query.requests import default_vector_profile, make_queries
from polyindex.storage import compaction, encoders, gc
from polyindex.storage.table import Table
from polyindex.types import MAX_K, MAX_SCROLL, Document, Hit, Page, Ranking, check_fields


class Collection:
    def __init__(self, folder: Path, device: str = "cpu", online: bool = False,
                 readonly: bool = False, dir_lock=None, follow_wal: bool = True):
        # The engine's data-directory lock is kept alive by the table while this handle can
        # write (a collection outliving its engine object must not let a second writer in).
        self.table = table = Table(folder, device, readonly, token_encoder=token_encoder,
                                   dir_lock=dir_lock)
        table.encoding = self.encoding = Encoding(table.name, table.config.model,
                                                  table.config.dtype, device, table.kinds)
        self.encoding.follow(table.encoder_now[0])  # an adapted encoder (storage.encoders)
        self.folder, self.name, self.device, self.uid = folder, table.name, device, table.uid
        self.online, self.readonly = online, readonly
        self.kinds = table.kinds  # the same dict (never rebound)
        self._profiles: dict = {}
        table.on_config_change = self._profiles.clear  # the dict's method: no cycle
        # the online writer and its merger, or a reader's follower of the WAL
        self.live = Live(table, online, follow_wal)

    @property
    def config(self):
        return self.table.config

    closed = property(lambda self: self.table.closed)
    encoder = property(lambda self: self.encoding.encoder)

    def vector_spec(self):
        """The vector fields the user fills (the servicer asks any implementation)."""
        return self.encoding.vector_spec()

    def view(self):
        """What queries see: a ``Snapshot`` (the newest committed one, plus, in online mode,
        the acknowledged writes not yet sealed)."""
        if self.closed:
            raise NotFound(f"collection {self.name!r} was dropped or closed")
        return self.live.snapshot()

    def snapshot(self, path, *, link: bool = False, progress=None) -> dict:
        """A backup of the collection written to ``path`` (``Live.backup``: every write
        acknowledged before the call is in it) and its summary; ``link``: hard links."""
        self.view()  # a closed collection says so
        return self.live.backup(Path(path), link=link, progress=progress)

    def catch_up(self) -> None:
        """A reader: take in the writer's acknowledged writes now (not at the next check)."""
        self.live.catch_up()

    # -- writes ----------------------------------------------------------------------------
    def index(self, source, *, skip_invalid: bool = False, progress: bool = False,
              force: bool = False, prune_quality: float | None = None,
              quality_model: str | Path | None = None):
        """Bulk-index a source (path or Source); see ``polyindex.ingest.bulk.bulk_index``.
        ``prune_quality`` P in [0, 1): the fraction P of the input with the lowest quality
        estimate is kept out of the costly representations (not encoded; stored, found by
        lexical queries); the threshold is stored and applied to every later write.
        ``quality_model``: a LightGBM text model instead of the shipped one."""
        from polyindex.ingest.bulk import bulk_index
        from polyindex.ingest.sources import Source, open_source
        from polyindex.ingest import quality  # LightGBM's scorer: only an indexing run loads it
        from polyindex.rerank.doc_quality import check_fraction
        prune = None if prune_quality is None else check_fraction(prune_quality)
        src = source if isinstance(source, Source) else open_source(source)
        return bulk_index(self.table, src, skip_invalid=skip_invalid, progress=progress,
                          force=force, plan=partial(quality.plan, self.folder, self.name,
                                                    prune=prune, model=quality_model))

    def add(self, docs: Iterable[Any], *, embeddings: np.ndarray | None = None) -> int:
        """Upsert documents (dicts or Documents) as one new segment; all or nothing.

        ``embeddings``: the collection model's embeddings of the documents, (n, d) float32 in
        their order (ids then must be unique), computed elsewhere (a sharded router encodes
        a batch once, as one node would, and sends each shard its rows)."""
        unique: dict[str, Document] = {}
        spec = self.encoding.vector_spec()
        for i, d in enumerate(docs):
            doc = documents.from_user(d, i, spec, self.config.fields)
            unique.pop(doc.id, None)
            unique[doc.id] = doc
        if not unique:
            return 0
        batch = list(unique.values())
        if embeddings is not None:
            embeddings = documents.check_embeddings(embeddings, batch, i + 1)
            if not self.encoding.encodes_text():
                embeddings = None  # nothing here reads model embeddings
        online = self.live.writes  # read once: a concurrent drop sets it to None
        if online is not None:
            return online.upsert(batch, embeddings)
        with self.table.writer() as w:
            w.commit_segment(batch, self.config.fields, embeddings=embeddings,
                             vectors=spec.stack(batch) if spec else None)
        self.table.refresh()
        self.live.wrote()
        return len(unique)

    def delete(self, ids: Sequence[str]) -> int:
        return self.live.delete(documents.check_ids(ids))

    def delete_where(self, filter: dict) -> int:
        """Delete what matches ``filter``, chosen under the write lock: exact at one point."""
        return self.live.delete_matching(partial(  # None is refused (by compile): not "all"
            scan.matching_ids, expr=compile_filter(filter, self.config.fields)))

    # -- reads -----------------------------------------------------------------------------
    def count(self, filter: dict | None = None) -> int:
        return scan.count(self.view(), self._filter(filter))

    def scroll(self, *, filter: dict | None = None, limit: int = 100, cursor: str | None = None,
               fields: Sequence[str] | None = None, with_vectors: bool = False) -> Page:
        """A page in a stable order and the next page's cursor (``query.scan``)."""
        return scan.scroll(self.view(), self._filter(filter), cursor,
                           scan.check_limit(limit, MAX_SCROLL),
                           check_fields(fields), with_vectors)

    def export(self, path, *, progress=None) -> int:
        """Every document to a Parquet file ``index`` reads back (``ingest.export``)."""
        return export_parquet(path, self.info(), self.count(), self.scroll, progress)

    def get(self, ids: Sequence[str], *, with_vectors: bool = False,
            fields: Sequence[str] | None = None) -> list[Document | None]:
        """Documents by id (None where absent); ``with_vectors``: with their stored vectors
        (by field: "dense" and the named ones); ``fields``: only these metadata fields."""
        return scan.by_id(self.view(), documents.check_ids(ids), check_fields(fields),
                          with_vectors, self.kinds)

    def _filter(self, spec: dict | None):
        return None if spec is None else compile_filter(spec, self.config.fields)

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
        self.table.commit_metadata(profiles={name: profile})

    def profiles(self) -> dict[str, dict]:
        return {**builtin_profiles(list(self.kinds)), **self.config.profiles}

    def query(self, text: str | None = None, *, vector=None, using: str | None = None,
              tokens=None, k: int = 10, profile=None, filter: dict | None = None,
              explain: bool = False, with_text: bool = False,
              with_metadata: bool | None = None, fields: Sequence[str] | None = None
              ) -> list[Hit]:
        """``vector``: a list/array for the unnamed field (or the field ``using`` names), or a
        dict field -> vector (several named vectors; fused by ``profile``, by default RRF).
        ``tokens``: an (n_tokens, d) query matrix for a ``multivector:source=user`` index
        (alone, profile ``multivector`` by default).
        ``with_metadata`` (default: as ``with_text``) fills each hit's stored metadata
        (``fields``: only these fields, and metadata even without ``with_metadata``)."""
        vectors = None if vector is None else [vector]
        texts = None if text is None else [text]
        got = vector_lane.answer(self, "search", texts, vectors, using, tokens, k, profile,
                                 filter, explain, with_text, with_metadata, fields)
        if got is not None:
            return got
        return self.query_batch(texts, vectors=vectors, using=using,
                                tokens=None if tokens is None else [tokens],
                                k=k, profile=profile, filter=filter, explain=explain,
                                with_text=with_text, with_metadata=with_metadata,
                                fields=fields)[0]

    def query_ids(self, text: str | None = None, *, vector=None, using: str | None = None,
                  tokens=None, k: int = 10, profile=None, filter: dict | None = None) -> Ranking:
        """``query``'s ids and scores as arrays (``types.Ranking``), no ``Hit`` objects."""
        vectors = None if vector is None else [vector]
        texts = None if text is None else [text]
        got = vector_lane.answer(self, "rank", texts, vectors, using, tokens, k, profile,
                                 filter, False, False, False, None)
        if got is not None:
            return got
        return self._run(texts, vectors, using, None if tokens is None else [tokens], k,
                         profile, filter, ranking=True)[0]

    def _lane(self, profile, takes: str, texts, vectors):
        """(the snapshot, its lane plan for ``profile`` taking ``takes``, or None: the
        general path)."""
        def resolve():
            name = profile if profile is not None else default_vector_profile(
                make_queries(texts and texts[:1], vectors and vectors[:1]), None, self.kinds)
            return self._profile(name)
        snap = self.view()
        return snap, vector_lane.plan(snap, profile, resolve, takes)

    def query_batch(self, texts: Sequence[str] | None = None, *, vectors=None,
                    using: str | None = None, tokens=None, k: int = 10, profile=None,
                    filter: dict | None = None, explain: bool = False,
                    with_text: bool = False, with_metadata: bool | None = None,
                    fields: Sequence[str] | None = None) -> list[list[Hit]]:
        """Run many queries through one profile; query-wide work is done once per batch."""
        fields = check_fields(fields)
        with_metadata = True if fields is not None else with_metadata
        got = vector_lane.answer(self, "search_batch", texts, vectors, using, tokens, k,
                                 profile, filter, explain, with_text, with_metadata, fields)
        if got is not None:
            return got
        return self._run(texts, vectors, using, tokens, k, profile, filter, explain, with_text,
                         with_metadata, fields)

    def _run(self, texts, vectors, using, tokens, k, profile, filter, explain=False,
             with_text=False, with_metadata=None, fields=None, ranking=False):
        """The general path (``pipeline.run``) for a batch (a lane takes no bad ``k``)."""
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise (ResourceExhausted if isinstance(k, int) and k > MAX_K else InvalidArgument)(
                f"k must be an integer in 1..{MAX_K}, got {k!r}")
        queries = make_queries(texts, vectors, using, tokens)
        if profile is None:
            profile = default_vector_profile(queries, using, self.kinds)
        prof, snap = self._profile(profile), self.view()
        # encoded by the encoder that made the snapshot's vectors (an adapt may commit now)
        self.encoding.fill_queries(queries, *model_inputs(prof, self.kinds),
                                   current=lambda: encoders.model_of(self.folder, snap.manifest))
        return run(snap, queries, prof, k, self._filter(filter), explain, with_text,
                   with_metadata, fields, ranking)

    def info(self) -> dict:
        snap = self.view()
        m = snap.manifest
        return {"name": self.name, "version": m.version, "documents": snap.count(),
                "segments": len(m.segments), "deleted_rows": sum(s.n_deleted for s in m.segments),
                "indexes": [k.describe() for k in self.kinds.values()],
                "profiles": sorted(self.profiles()), "model": self.config.model,
                "encoder": (encoders.current(m) or {}).get("name", "base"),
                "dtype": self.config.dtype, "dtype_choice": self.config.dtype_choice,
                "encodes_text": self.encoding.encodes_text(), "fields": self.config.fields,
                "segment_size": self.config.segment_size,
                "vector_fields": {f.name: {"index": f.index, "dim": f.dim, "metric": f.metric}
                                  for f in self.encoding.vector_spec().fields.values()},
                "ingest": m.ingest, "format_version": m.format_version,
                **gc.disk_usage(self.folder, m), **self.live.pending()}

    def adapt(self, *, revert: bool = False, recipe=None, device: str | None = None,
              progress=None, ray: dict | None = None) -> dict:
        """Learn an encoder from this collection, re-encode with it (``adapt.run``)."""
        from polyindex.adapt.run import adapt
        return adapt(self, revert=revert, device=device, recipe=recipe, progress=progress,
                     ray=ray)

    # -- compaction ------------------------------------------------------------------------
    def merge(self, ids: Sequence[str], stop=lambda: False) -> dict | None:
        """Merge the segments ``ids`` into one (``storage.compaction.merge``)."""
        return compaction.merge(self.table, ids, stop, self.live.writes)

    def compact(self, max_segments: int | None = None, on_merge=None) -> dict:
        """Merge until the policy (or ``max_segments``) is met and no deleted row is left;
        returns a report (``storage.compaction.compact``)."""
        return compaction.compact(self.table, max_segments, on_merge, self.live.writes)

    def storage_report(self) -> dict:
        return compaction.storage_report(self.table)

    def seal(self) -> None:
        """Online mode: seal the buffered writes into a segment now."""
        self.live.seal()

    def close(self) -> None:
        """Release resources; in online mode, seal what is buffered first."""
        self.live.close()

    def abandon(self) -> None:
        """Close without sealing (the collection is being dropped): stops the sealer, waits
        for an in-flight seal, closes the WAL; every later call answers NotFound."""
        self.live.abandon()
