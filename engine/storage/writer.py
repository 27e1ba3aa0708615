"""The single writer of a collection: seals segments and commits manifests.

Each segment is built in a temporary folder, fsynced, renamed into ``segments/`` and only
then named by a manifest commit; a crash before the commit leaves an unreferenced folder
that the next writer removes. Rows that a new segment's ids replace (upsert, last write
wins) and deleted rows are tombstoned in new, versioned tombstone files.

Every file a manifest names, and its folder, is fsynced before that manifest is renamed into
place, and its size and xxh3 go into the manifest. The failpoints of the commit path
(``polyindex.storage.failpoints``): ``commit.segment`` (fsync of the built folder's files and
the folder, its rename into ``segments/``, fsync of ``segments/``), ``commit.tombstones``
(write + fsync of each file, fsync of ``tombstones/``), ``commit.artifacts`` (fsync of
``artifacts/<kind>/``'s files, the folder and ``artifacts/``) and ``commit.manifest``.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from polyindex.errors import ResourceExhausted
from polyindex.index.dense.presence import missing_rows, placeholders_zeroed
from polyindex.index.protocol import BuildBatch, DocTokens, IndexKind
from polyindex.storage import failpoints, idindex
from polyindex.storage.fsutil import fsync_dir, fsync_file, fsync_tree, rename, write_file
from polyindex.storage.integrity import remember, sum_bytes, sum_file
from polyindex.storage.manifest import Manifest, SegmentEntry, commit_manifest, load_manifest
from polyindex.storage.segment import Segment, load_tombstones, tombstone_bytes, write_docs
from polyindex.types import Document, document_text

QUALITY_ARTIFACT = "quality"  # rerank.doc_quality.ARTIFACT (storage does not import rerank)


def batch_of(docs: Sequence[Document], embeddings: np.ndarray | None,
             tokens: Sequence[DocTokens] | None = None,
             vectors: dict[str, np.ndarray] | None = None,
             collection_rows: int = 0, pruned: np.ndarray | None = None) -> BuildBatch:
    if embeddings is None and vectors:
        embeddings = vectors.get("dense")  # the unnamed field, filled by the user
    if tokens is None and docs and docs[0].tokens is not None:
        tokens = [DocTokens(d.tokens) for d in docs]  # the user's (multivector:source=user)
    if pruned is not None and not pruned.any():
        pruned = None
    return BuildBatch([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
                      embeddings, tokens, dict(vectors or {}), collection_rows, pruned)


def stored_columns(kinds: dict[str, IndexKind], embeddings: np.ndarray | None,
                   vectors: dict[str, np.ndarray] | None):
    """(embedding column or None, {vector.<field>: matrix}) for docs.arrow: each vector is
    stored once, in the faiss index when it keeps vectors exactly (Flat, HNSW..,Flat), else
    as a column. The unnamed field (model embeddings or the user's) is a column too when
    another kind reads embeddings from the documents (tree, sparse)."""
    vectors = vectors or {}
    dense = {getattr(k, "field", None): k for k in kinds.values() if k.kind == "dense"}

    def in_index(f: str) -> bool:
        return f in dense and dense[f].keeps_vectors()

    # an optional field's missing vectors (NaN rows) are stored as zeros: the field's index
    # keeps which rows are real (``index.dense.presence``)
    columns = {f"vector.{f}": placeholders_zeroed(m, missing_rows(m))
               for f, m in vectors.items() if f != "dense" and not in_index(f)}
    if embeddings is None:
        embeddings = vectors.get("dense")  # the unnamed field, filled by the user
    others_read = any(k.needs_embeddings and k.kind != "dense" for k in kinds.values())
    if embeddings is not None and in_index("dense") and not others_read:
        embeddings = None
    return embeddings, columns


def build_segment(folder: Path, docs: Sequence[Document], fields: dict[str, str],
                  kinds: dict[str, IndexKind], embeddings: np.ndarray | None,
                  tokens: Sequence[DocTokens] | None = None,
                  vectors: dict[str, np.ndarray] | None = None,
                  collection_rows: int = 0, quality: np.ndarray | None = None,
                  pruned: np.ndarray | None = None) -> dict[str, dict]:
    """Write a segment's files (documents and every kind's index) into a fresh ``folder``;
    ``vectors`` are the user's vectors by field (the unnamed one is ``"dense"``);
    ``collection_rows``: the live rows it joins (``BuildBatch.collection_rows``);
    ``quality``/``pruned``: the documents' quality column and pruned rows."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        column, extra = stored_columns(kinds, embeddings, vectors)
        write_docs(folder, docs, fields, column, extra, quality, pruned)
        batch = batch_of(docs, embeddings, tokens, vectors, collection_rows, pruned)
        return {name: kind.build(batch, folder) for name, kind in kinds.items()}
    except BaseException:
        # A build that failed (a full disk) must not keep the space its retry needs
        shutil.rmtree(folder, ignore_errors=True)
        raise


def build_segment_columns(folder: Path, columns: tuple, fields: dict[str, str],
                          kinds: dict[str, IndexKind], embeddings: np.ndarray | None,
                          tokens: Sequence[DocTokens] | None = None,
                          vectors: dict[str, np.ndarray] | None = None,
                          collection_rows: int = 0, quality: np.ndarray | None = None,
                          pruned: np.ndarray | None = None) -> dict[str, dict]:
    """``build_segment`` from (ids, titles, texts, metadata) lists (the build process's
    form: cheap to pickle); the vectors come in ``embeddings`` / ``vectors``."""
    docs = [Document(i, t, x, m) for i, t, x, m in zip(*columns)]
    return build_segment(folder, docs, fields, kinds, embeddings, tokens, vectors,
                         collection_rows, quality, pruned)


@contextmanager
def writer_lock(folder: Path, wait: bool = True):
    """One writer per collection across processes (readers never take it)."""
    fd = os.open(folder / "LOCK", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise ResourceExhausted(f"collection {folder.name!r} is being written by another "
                                    "process") from None
        yield
    finally:
        os.close(fd)


class Writer:
    def __init__(self, folder: Path, kinds: dict[str, IndexKind],
                 encode: Callable[[list[str], Callable[[int], None] | None], np.ndarray] | None,
                 open_segment: Callable[[str], Segment | None] | None = None):
        self.folder = folder
        self.open_segment = open_segment
        self.kinds = kinds
        self.encode = encode
        self.manifest: Manifest = load_manifest(folder)
        # Files the commits of this writer stopped naming (replaced tombstone versions,
        # merged-away segments): removed by garbage collection once no snapshot pins them.
        self.garbage: list[str] = []
        # The documents' quality at write time (set by the collection): ``quality(writer, m, texts)
        # -> (quality float32, pruned bool, artifact files to commit under artifacts/quality/
        # or None)``; None: no estimate (the column is not written).
        self.quality: Callable | None = None
        self._remove_uncommitted()

    def _remove_uncommitted(self) -> None:
        # Built but never committed (a crash between build and commit): not visible, and in
        # the way of the next segment id. Unlisted segments below ``next_segment`` were
        # committed once (merged away since): garbage collection removes them, once no
        # live snapshot reads them.
        for entry in (self.folder / "segments").iterdir():
            name = entry.name
            if name.startswith(".seg-") or (name.startswith("seg-") and name[4:].isdigit()
                                            and int(name[4:]) >= self.manifest.next_segment):
                shutil.rmtree(entry, ignore_errors=True)

    def _tombstone(self, m: Manifest, s: int, new_dead: np.ndarray) -> bool:
        """Write segment ``s``'s new tombstone file (fsynced; its folder is not); returns
        whether one was written."""
        entry = m.segments[s]
        live_prev = None
        if entry.tombstones:
            live_prev = load_tombstones(self.folder, entry)
        dead = new_dead if live_prev is None else (new_dead | ~live_prev)
        if live_prev is not None and not (dead & live_prev).any():
            return False
        rel = f"tombstones/{entry.id}.v{m.version + 1}.arrow"
        if entry.tombstones and entry.tombstones != rel:
            self.garbage.append(entry.tombstones)
        data = tombstone_bytes(np.flatnonzero(dead))
        write_file(self.folder / rel, data, "commit.tombstones")
        entry.tombstones, entry.n_deleted = rel, int(dead.sum())
        entry.tombstones_sum = sum_bytes(data)
        remember(self.folder / rel, entry.tombstones_sum)
        return True

    def _segment(self, entry: SegmentEntry) -> Segment:
        """A committed segment's documents: the collection's opened one when it has it (its
        id index is already mapped), else opened here."""
        seg = self.open_segment(entry.id) if self.open_segment is not None else None
        return seg if seg is not None else Segment(
            self.folder / "segments" / entry.id, entry.id, entry.n_rows, sums=entry.files,
            validate=entry.legacy)

    def _tombstone_ids(self, m: Manifest, ids: Sequence[str]) -> int:
        """Tombstone every live row whose id is in ``ids`` (files and ``tombstones/``
        fsynced); returns how many rows died. Costs the batch (its hashes, then two binary
        searches a segment), not the segments' sizes."""
        killed, written = 0, False
        ids = list(ids)
        hashes = idindex.hash_ids(ids)
        for s, entry in enumerate(m.segments):
            seg = self._segment(entry)
            _, rows = seg.lookup(ids, hashes)
            if not len(rows):
                continue
            hit = np.zeros(entry.n_rows, dtype=bool)
            hit[rows] = True
            before = entry.n_deleted
            written |= self._tombstone(m, s, hit)
            killed += m.segments[s].n_deleted - before
        if written:
            fsync_dir(self.folder / "tombstones", "commit.tombstones")
        return killed

    def commit_segment(self, docs: Sequence[Document], fields: dict[str, str],
                       ingest: dict | None = None,
                       on_encoded: Callable[[int], None] | None = None,
                       embeddings: np.ndarray | None = None,
                       delete_ids: Sequence[str] = (),
                       tokens: Sequence[DocTokens] | None = None,
                       wal_through: int | None = None,
                       vectors: dict[str, np.ndarray] | None = None,
                       build: Callable | None = None) -> SegmentEntry | None:
        """Seal ``docs`` (unique ids) as a new segment and commit, in one manifest version,
        with ``delete_ids`` tombstoned first; returns the new segment's entry. ``wal_through``:
        the WAL sequence number these writes reach (online seals). ``vectors``: the user's
        vectors by field, (n, d) float32 in document order. ``build``: writes the segment's
        files, ``build_segment``'s signature (online seals use the build process)."""
        m = self.manifest.copy()
        if ingest is not None:
            m.ingest = ingest
        if wal_through is not None:
            m.wal_through = max(m.wal_through, wal_through)
        if delete_ids:
            self._tombstone_ids(m, delete_ids)
        if not docs:
            self.manifest = commit_manifest(self.folder, m)
            return None
        quality = pruned = None
        if self.quality is not None:
            quality, pruned, files = self.quality(self, m, [document_text(d.title, d.text)
                                                            for d in docs])
            if files:
                self._add_artifact(m, QUALITY_ARTIFACT, files)
            if not pruned.any():
                pruned = None
        if embeddings is None and tokens is None and self.encode is not None:
            embeddings, tokens = encode_kept(self.encode, docs, pruned, on_encoded)
        elif pruned is not None and embeddings is not None:  # encoded before (online, Ray)
            embeddings = np.array(embeddings, dtype=np.float32)
            embeddings[pruned] = 0.0
        for name, files in train_kinds(self.folder, self.kinds,
                                       batch_of(docs, embeddings, tokens, vectors,
                                                pruned=pruned)).items():
            self._add_artifact(m, name, files)
        seg_id = f"seg-{m.next_segment:06d}"
        # The pid: a build process of a writer that died never writes into the next one's
        tmp = self.folder / "segments" / f".{seg_id}.{os.getpid()}.tmp"
        failpoints.hit("commit.segment.write", tmp)
        live = sum(e.n_rows - e.n_deleted for e in m.segments)
        extra = {} if quality is None else {"quality": quality, "pruned": pruned}
        infos = (build or build_segment)(tmp, docs, fields, self.kinds, embeddings, tokens,
                                         vectors, collection_rows=live, **extra)
        try:
            return self._install(m, tmp, [d.id for d in docs], infos)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # not yet renamed: never committed
            raise

    def commit_built(self, tmp: Path, n_rows: int, infos: dict[str, dict],
                     ingest: dict | None = None,
                     artifacts: dict[str, list[str]] | None = None) -> SegmentEntry:
        """Commit a segment folder built elsewhere (a Ray worker: ``build_segment`` into a
        ``.seg-*`` folder of ``segments/``, so a crash before this leaves what the next
        writer removes), with the artifacts its builder trained (already under
        ``artifacts/<name>/``) and the source position; its ids are read from its files."""
        m = self.manifest.copy()
        if ingest is not None:
            m.ingest = ingest
        for name, files in (artifacts or {}).items():
            self._add_artifact(m, name, list(files))
        ids = Segment(tmp, tmp.name, n_rows).ids.tolist()  # Corrupt unless n_rows rows
        return self._install(m, tmp, ids, infos)

    def _install(self, m: Manifest, tmp: Path, ids: list[str], infos: dict) -> SegmentEntry:
        """fsync the built folder, sum its files, rename it into place, tombstone the rows
        its ids replace and commit ``m`` with it."""
        seg_id = f"seg-{m.next_segment:06d}"
        fsync_tree(tmp, "commit.segment")
        # Summed after the fsync: one read of each file, from the page cache.
        files = {p.name: sum_file(p) for p in sorted(tmp.iterdir())}
        final = self.folder / "segments" / seg_id
        rename(tmp, final, "commit.segment")
        fsync_dir(self.folder / "segments", "commit.segment")
        for name, expect in files.items():
            remember(final / name, expect)
        self._tombstone_ids(m, ids)
        entry = SegmentEntry(seg_id, len(ids), infos, files=files)
        m.segments.append(entry)
        m.next_segment += 1
        self.manifest = commit_manifest(self.folder, m)
        return entry

    def commit_metadata(self, *, profiles: dict[str, dict] | None = None,
                        artifacts: dict[str, list[str]] | None = None) -> None:
        """Commit new rank profiles and/or collection-level artifacts (files written under
        ``artifacts/<name>/``; fsynced and summed here) in one manifest version."""
        m = self.manifest.copy()
        if profiles:
            m.config.profiles.update(profiles)
        for name, files in (artifacts or {}).items():
            self._add_artifact(m, name, list(files))
        self.manifest = commit_manifest(self.folder, m)

    def delete(self, ids: Sequence[str]) -> int:
        m = self.manifest.copy()
        killed = self._tombstone_ids(m, ids)
        if killed:
            self.manifest = commit_manifest(self.folder, m)
        return killed

    def _add_artifact(self, m: Manifest, name: str, files: list[str]) -> None:
        """Name ``artifacts/<name>/<files>`` in ``m``: each file and the folder fsynced (and
        ``artifacts/``, which may have just gained the folder), each file summed."""
        art = self.folder / "artifacts" / name
        sums = {}
        for f in files:
            fsync_file(art / f, "commit.artifacts")
            sums[f] = sum_file(art / f)
            remember(art / f, sums[f])
        fsync_dir(art, "commit.artifacts")
        fsync_dir(art.parent, "commit.artifacts")
        m.artifacts[name] = files
        m.artifact_sums[name] = sums


def encode_kept(encode, docs: Sequence[Document], pruned: np.ndarray | None,
                on_encoded: Callable[[int], None] | None = None):
    """(embeddings, tokens or None) of ``docs`` from ``encode(texts, on_batch)``, encoding
    only the rows not ``pruned``: a pruned row gets a zero embedding and a one-token zero
    placeholder (kinds never search it). A segment whose every row is pruned encodes its
    first one (for the dimension)."""
    texts = [document_text(d.title, d.text) for d in docs]
    if pruned is None:
        out = encode(texts, on_encoded)
        return out if isinstance(out, tuple) else (out, None)
    kept = np.flatnonzero(~pruned)
    if not len(kept):
        kept = np.zeros(1, np.int64)
    if on_encoded is not None:
        on_encoded(len(docs) - len(kept))  # the bar counts what will never be encoded
    out = encode([texts[i] for i in kept.tolist()], on_encoded)
    emb, toks = out if isinstance(out, tuple) else (out, None)
    full = None
    if emb is not None:  # None: only token kinds read the model (multivector alone)
        full = np.zeros((len(docs), emb.shape[1]), np.float32)
        full[kept] = emb
    if toks is None:
        return full, None
    t0 = toks[0]

    def zero(a, dtype):
        return None if a is None else np.zeros(1, dtype=a.dtype if dtype is None else dtype)

    placeholder = DocTokens(np.zeros((1, t0.vectors.shape[1]), t0.vectors.dtype),
                            zero(t0.special, None), zero(t0.salience, None),
                            zero(t0.token_ids, None))
    tokens = [placeholder] * len(docs)
    for i, t in zip(kept.tolist(), toks):
        tokens[i] = t
    return full, tokens


def train_kinds(folder: Path, kinds: dict[str, IndexKind], batch: BuildBatch) -> dict[str, list[str]]:
    """Train every kind that needs it on ``batch`` (the first segment's documents) and save
    its artifacts under ``folder/artifacts/<name>/``; returns {name: files} to commit."""
    out = {}
    for kind in kinds.values():
        if kind.needs_training():
            kind.train(batch)
            art = folder / "artifacts" / kind.artifact_name
            art.mkdir(parents=True, exist_ok=True)
            out[kind.artifact_name] = kind.save_artifacts(art)
    return out
