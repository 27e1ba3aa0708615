"""Online writes: WAL-acknowledged upserts and deletes, searchable at once, sealed later.

Each acknowledged write batch becomes a small in-memory *buffer segment* built by the same
kinds' ``build`` as a sealed one (so its scores are computed the same way) and is composed
into the collection's snapshot together with the rows it hides in older segments. A
background thread seals the buffer into a real segment by size or age: the buffer is frozen
with the WAL sequence number it reaches, committed as one manifest version (new segment,
buffered deletes, ``wal_through``), and only then are the WAL files it covers deleted. A seal
that fails keeps its frozen buffer and its WAL files and is retried with backoff; past a
bound of unsealed documents, writes are refused (RESOURCE_EXHAUSTED) instead of growing
without limit. On open, the WAL records above the manifest's ``wal_through`` are replayed.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
import time
from typing import Sequence

import numpy as np

from polyindex.errors import NotFound, ResourceExhausted
from polyindex.index.protocol import DocTokens
from polyindex.online.wal import WriteAheadLog, disk_error
from polyindex.storage import build_worker, idindex
from polyindex.storage.manifest import SegmentEntry
from polyindex.storage.snapshot import OpenedSegment, Snapshot
from polyindex.storage.writer import build_segment
from polyindex.types import Document, document_text

# Seal when this many documents are buffered, or when the oldest buffered write is this old
# (settable per process, e.g. for `polyindex serve`, by environment variable).
SEAL_DOCS = int(os.environ.get("POLYINDEX_SEAL_DOCS", 5_000))
SEAL_SECONDS = float(os.environ.get("POLYINDEX_SEAL_SECONDS", 30.0))
MAX_BUFFER_SEGMENTS = 8  # more small buffer segments than this are merged into one
# Unsealed documents beyond which writes are refused while sealing fails (memory is bounded
# by this, the WAL's disk use likewise); generous, so that a slow seal never trips it.
MAX_BACKLOG = int(os.environ.get("POLYINDEX_MAX_BACKLOG", 0)) or None
BACKOFF_S = (0.5, 30.0)  # first and longest wait between retries of a failed seal
log = logging.getLogger("polyindex.online")


class Buffer:
    """Writes since the last seal: latest version of each id, deleted ids, their segments."""

    def __init__(self):
        self.docs: dict[str, Document] = {}
        self.vectors: dict[str, np.ndarray] = {}
        self.deleted: set[str] = set()
        self.segments: list[OpenedSegment] = []
        self.live: list[np.ndarray] = []
        self.where: dict[str, tuple[int, int]] = {}
        self.started: float | None = None
        self.through = 0  # WAL sequence number of the last write in this buffer

    def empty(self) -> bool:
        return not self.docs and not self.deleted

    def hidden_ids(self) -> list[str]:
        """Ids whose older rows this buffer hides (upserted or deleted here)."""
        return list(self.docs.keys() | self.deleted)

    def add_segment(self, seg: OpenedSegment, docs: Sequence[Document], vectors) -> None:
        s = len(self.segments)
        self.segments.append(seg)
        self.live.append(np.ones(len(docs), dtype=bool))
        for row, d in enumerate(docs):
            self._forget(d.id)
            self.where[d.id] = (s, row)
            self.docs[d.id] = d
            if vectors is not None:
                self.vectors[d.id] = vectors[row]
            self.deleted.discard(d.id)
        self.started = self.started or time.monotonic()

    def delete(self, ids: Sequence[str]) -> None:
        for i in ids:
            self._forget(i)
            self.docs.pop(i, None)
            self.vectors.pop(i, None)
            self.deleted.add(i)
        self.started = self.started or time.monotonic()

    def _forget(self, doc_id: str) -> None:
        old = self.where.pop(doc_id, None)
        if old is not None:
            self.live[old[0]] = self.live[old[0]].copy()  # snapshots keep the old mask
            self.live[old[0]][old[1]] = False


class OnlineWrites:
    def __init__(self, coll, seal_docs: int | None = None, seal_seconds: float | None = None):
        self.coll = coll
        self.seal_docs = SEAL_DOCS if seal_docs is None else seal_docs
        self.seal_seconds = SEAL_SECONDS if seal_seconds is None else seal_seconds
        # model embeddings are encoded here; user vectors travel on the documents
        self.needs_vectors = coll.encodes_text() and any(k.needs_embeddings
                                                         for k in coll.kinds.values())
        self.spec = coll.vector_spec()
        self.max_backlog = MAX_BACKLOG or max(50_000, 10 * self.seal_docs)
        self.scratch = coll.folder / "buffer"
        shutil.rmtree(self.scratch, ignore_errors=True)  # buffer segments are rebuilt from the WAL
        self.scratch.mkdir()
        self.closed = False
        self.seal_failures = 0          # consecutive failed seals (0: the last one worked)
        self.last_seal_error: str | None = None
        self._retry_at = 0.0
        self._names = itertools.count()
        self.lock = threading.RLock()       # serializes writes and snapshot swaps
        self.seal_lock = threading.Lock()   # one seal at a time
        self.active, self.frozen = Buffer(), None
        self.base: Snapshot = coll.sealed_snapshot()
        self.overlay: list[np.ndarray | None] = []
        self.combined: list[np.ndarray | None] = []
        self._rehide_all()
        self.view: Snapshot = self.base
        self.wal = WriteAheadLog(coll.folder / "wal", after=self.base.manifest.wal_through)
        self._replay()
        try:  # files a crash left behind after their seal committed
            self.wal.drop_through(self.base.manifest.wal_through)
        except OSError as e:
            log.warning("%s: could not delete sealed WAL files: %s", coll.name, e)
        self.on_sealed = lambda: None  # e.g. wakes the background merger
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sealer, name=f"seal-{coll.name}", daemon=True)
        self._thread.start()

    # -- writes ----------------------------------------------------------------------------
    def upsert(self, docs: list[Document]) -> int:
        # [id, title, text, metadata] + [vectors] when the document has vectors or tokens,
        # + [token matrix] when it has tokens (multivector:source=user)
        record = {"op": "upsert", "docs": [[d.id, d.title, d.text, d.metadata] +
                                           ([{f: v.tolist() for f, v in (d.vectors or {}).items()}]
                                            if d.vectors or d.tokens is not None else []) +
                                           ([d.tokens.tolist()] if d.tokens is not None else [])
                                           for d in docs]}
        vectors = self._encode(docs)  # before the WAL: an encoder failure acknowledges nothing
        with self.lock:
            self._check_writable(len(docs))
            # Build first: a failure there acknowledges nothing and leaves nothing in the WAL;
            # once the append returns, the write is durable and nothing below can fail it.
            try:
                seg = self._build(docs, vectors)
            except OSError as e:
                raise disk_error(e, "building the write buffer") from e
            try:
                self.active.through = self.wal.append(record)
            except BaseException:
                _remove([seg])
                raise
            self._add_built(seg, docs, vectors)
        return len(docs)

    def delete(self, ids: list[str]) -> int:
        with self.lock:
            self._check_writable(0)
            n = sum(loc is not None for loc in self.view.find(ids))
            self.active.through = self.wal.append({"op": "delete", "ids": ids})
            self._apply_delete(ids)
        return n

    def _check_writable(self, adding: int) -> None:
        if self.closed:
            raise NotFound(f"collection {self.coll.name!r} was dropped or closed")
        backlog = len(self.active.docs) + (len(self.frozen.docs) if self.frozen else 0)
        if self.seal_failures and backlog + adding > self.max_backlog:
            raise ResourceExhausted(
                f"collection {self.coll.name!r}: {backlog} acknowledged documents wait to be "
                f"sealed and sealing keeps failing ({self.seal_failures} attempts; last error: "
                f"{self.last_seal_error}); writes resume once a seal succeeds")

    def _encode(self, docs: Sequence[Document]):
        if not self.needs_vectors or not docs:
            return None
        return self.coll.encoder.encode([document_text(d.title, d.text) for d in docs])

    def _apply_upsert(self, docs, vectors) -> None:
        self._add_built(self._build(docs, vectors), docs, vectors)

    def _add_built(self, seg: OpenedSegment, docs, vectors) -> None:
        self.active.add_segment(seg, docs, vectors)
        self._hide([d.id for d in docs])
        if len(self.active.segments) > MAX_BUFFER_SEGMENTS:
            try:
                self._merge_active()
            except Exception as e:  # noqa: BLE001 - only slower queries until the next seal
                log.warning("%s: merging buffer segments failed: %s", self.coll.name, e)
        self._publish()

    def _apply_delete(self, ids) -> None:
        self.active.delete(ids)
        self._hide(list(ids))
        self._publish()

    def _build(self, docs, vectors, remote: bool = False) -> OpenedSegment:
        folder = self.scratch / f"buf-{next(self._names):08d}"
        infos = (_remote_build if remote else build_segment)(
            folder, docs, self.coll.config.fields, self.coll.kinds, vectors,
            vectors=self.spec.stack(docs) if self.spec else None)
        return OpenedSegment(folder, SegmentEntry(folder.name, len(docs), infos), self.coll.kinds)

    def _merge_active(self) -> None:
        """Many small buffer segments cost per-query overhead: rebuild them as one."""
        old = self.active
        docs = list(old.docs.values())
        merged = Buffer()
        merged.deleted, merged.started, merged.through = set(old.deleted), old.started, old.through
        if docs:
            vectors = np.stack([old.vectors[d.id] for d in docs]) if self.needs_vectors else None
            merged.add_segment(self._build(docs, vectors, remote=True), docs, vectors)
            merged.deleted = set(old.deleted)
        self.active = merged
        _remove(old.segments)

    # -- snapshots -------------------------------------------------------------------------
    def _hide(self, ids: list[str], which: range | None = None) -> None:
        """Hide the rows of sealed (and frozen-buffer) segments that these ids replace. Costs
        the batch: its hashes, two binary searches a segment, and a new live mask only for
        the segments that hold one of the ids (published snapshots keep the old masks)."""
        under, base_live = self._under(), self._under_live()
        hashes = idindex.hash_ids(ids)
        for i in range(len(under)) if which is None else which:
            _, rows = under[i].docs.lookup(ids, hashes)
            if not len(rows):
                continue
            if self.overlay[i] is None:
                self.overlay[i] = np.zeros(under[i].docs.n_rows, dtype=bool)
            self.overlay[i][rows] = True
            mask = base_live[i]
            self.combined[i] = ~self.overlay[i] if mask is None else mask & ~self.overlay[i]

    def _under(self) -> list[OpenedSegment]:
        return self.base.segments + (self.frozen.segments if self.frozen else [])

    def _under_live(self) -> list[np.ndarray | None]:
        return self.base.live + (self.frozen.live if self.frozen else [])

    def _rehide_all(self) -> None:
        under = self._under()
        self.overlay = [None] * len(under)  # rows hidden by buffered writes, per segment
        self.combined = list(self._under_live())  # live masks with those rows hidden
        hidden = self.active.hidden_ids()
        n_base = len(self.base.segments)
        if self.frozen is not None:
            self._hide(self.frozen.hidden_ids() + hidden, range(n_base))
            if hidden:
                self._hide(hidden, range(n_base, len(under)))
        elif hidden:
            self._hide(hidden)

    def _publish(self) -> None:
        segments = self._under() + self.active.segments
        self.view = Snapshot(self.base.manifest, self.coll.kinds, segments,
                             self.combined + list(self.active.live))

    def snapshot(self) -> Snapshot:
        """The current view; re-based when the manifest changed under us (a metadata commit
        of this process, e.g. a trained ranker). ``manifest_changed`` is rate-limited, so it
        is asked once; ``sealed_snapshot`` re-reads only a changed file."""
        if self.closed:
            raise NotFound(f"collection {self.coll.name!r} was dropped or closed")
        # Not while a seal or merge commit is under way (it re-bases when done): a base
        # holding a seal's segment beside its frozen buffer would show those rows twice.
        if self.coll.manifest_changed() and self.seal_lock.acquire(blocking=False):
            try:
                self.rebase()
            finally:
                self.seal_lock.release()
        return self.view

    # -- sealing ---------------------------------------------------------------------------
    def seal(self) -> None:
        """Commit the buffered writes as one segment, then forget the WAL that held them.

        A frozen buffer whose commit failed is retried first (never overwritten); its WAL
        files stay until a committed manifest covers them."""
        with self.seal_lock:
            with self.lock:
                if self.closed:
                    return
                if self.frozen is None:
                    if self.active.empty():
                        return
                    self.frozen, self.active = self.active, Buffer()
                    self._rehide_all()
                    self._publish()
                    try:
                        self.wal.rotate()  # new writes go to a new file; a failure is harmless
                    except OSError as e:
                        log.warning("%s: WAL rotation failed (%s); continuing in the same file",
                                    self.coll.name, e)
            frozen = self.frozen
            docs = list(frozen.docs.values())
            vectors = (np.stack([frozen.vectors[d.id] for d in docs])
                       if self.needs_vectors and docs else None)
            try:
                with self.coll.writer() as w:
                    w.commit_segment(docs, self.coll.config.fields, embeddings=vectors,
                                     delete_ids=sorted(frozen.deleted - frozen.docs.keys()),
                                     wal_through=frozen.through,
                                     vectors=self.spec.stack(docs) if self.spec else None,
                                     build=_remote_build)
            except BaseException as e:
                self.seal_failures += 1
                self.last_seal_error = f"{type(e).__name__}: {e}"
                wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self.seal_failures - 1))
                self._retry_at = time.monotonic() + wait
                log.error("%s: sealing %d documents failed (attempt %d, retry in %.1f s): %s",
                          self.coll.name, len(docs), self.seal_failures, wait,
                          self.last_seal_error)
                raise
            self.seal_failures, self.last_seal_error, self._retry_at = 0, None, 0.0
            with self.lock:
                self.frozen = None
                self.base = self.coll.sealed_snapshot()
                self._rehide_all()
                self._publish()
            try:
                self.wal.drop_through(frozen.through)
            except OSError as e:  # harmless: replay skips records at or below wal_through
                log.warning("%s: could not delete sealed WAL files: %s", self.coll.name, e)
            _remove(frozen.segments)
            self.on_sealed()

    def rebase(self) -> None:
        """Compose the buffer over the newest committed manifest (the caller holds
        ``seal_lock``, so no seal is half done)."""
        with self.lock:
            base = self.coll.sealed_snapshot()
            if base is not self.base:
                self.base = base
                self._rehide_all()
                self._publish()

    def _due(self) -> bool:
        if self.frozen is not None:  # a failed seal: retry after its backoff
            return time.monotonic() >= self._retry_at
        a = self.active
        return a.started is not None and (len(a.docs) >= self.seal_docs or
                                          time.monotonic() - a.started >= self.seal_seconds)

    def _sealer(self) -> None:
        while not self._stop.wait(0.2):
            if self._due():
                try:
                    self.seal()
                except Exception:  # noqa: BLE001 - logged and counted by seal(); retried
                    pass

    def _replay(self) -> None:
        docs: dict[str, Document] = {}
        deleted: set[str] = set()
        for _seq, rec in self.wal.replay():
            if rec["op"] == "upsert":
                for i, t, x, m, *v in rec["docs"]:
                    docs.pop(i, None)
                    docs[i] = Document(i, t, x, m, {f: np.asarray(a, np.float32)
                                                    for f, a in v[0].items()} if v and v[0]
                                       else None,
                                       np.asarray(v[1], np.float32) if len(v) > 1 else None)
                    deleted.discard(i)
            else:
                for i in rec["ids"]:
                    docs.pop(i, None)
                    deleted.add(i)
        if not docs and not deleted:
            return
        self.active.through = self.wal.last_seq
        if deleted:
            self._apply_delete(sorted(deleted))
        if docs:
            batch = list(docs.values())
            self._apply_upsert(batch, self._encode(batch))

    def pending(self) -> dict:
        frozen = self.frozen
        return {"buffered_docs": len(self.active.docs) + (len(frozen.docs) if frozen else 0),
                "buffered_deletes": len(self.active.deleted) + (len(frozen.deleted) if frozen else 0),
                "wal_bytes": self.wal.size_bytes(), "wal_seq": self.wal.last_seq,
                "seal_failures": self.seal_failures, "last_seal_error": self.last_seal_error}

    def close(self) -> None:
        """Stop the sealer and seal what is buffered; if that seal fails, the WAL keeps the
        writes for the next open (the error is raised after the log is closed)."""
        self._stop.set()
        self._thread.join()
        try:
            self.seal()
            if self.frozen is None and not self.active.empty():
                self.seal()  # a retried frozen buffer went first; now the newer writes
        finally:
            with self.lock:
                self.closed = True
                self.wal.close()

    def abandon(self) -> None:
        """For a drop: stop the sealer, wait for an in-flight seal, close the WAL; nothing
        is sealed and every later call answers NotFound."""
        self._stop.set()
        self._thread.join()
        with self.seal_lock, self.lock:
            self.closed = True
            self.wal.close()


def _remote_build(folder, docs, fields, kinds, embeddings, tokens=None, vectors=None) -> dict:
    """``build_segment`` in the build process (off this process's GIL: queries beside a seal
    keep their latency), or here when build processes are off."""
    if not build_worker.enabled():
        return build_segment(folder, docs, fields, kinds, embeddings, tokens, vectors)
    # As columns: pickling 5,000 Document objects (with their vectors) took ~40 ms of GIL,
    # the columns ~1 ms; the stacked vectors travel once.
    columns = ([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
               [d.metadata for d in docs])
    if tokens is None and docs and docs[0].tokens is not None:  # multivector:source=user
        tokens = [DocTokens(d.tokens) for d in docs]
    return build_worker.run("seal", "polyindex.storage.writer:build_segment_columns", folder,
                            columns, fields, kinds, embeddings, tokens, vectors)


def _remove(segments: list[OpenedSegment]) -> None:
    # Memory-mapped files stay readable for queries still holding them (POSIX unlink).
    for s in segments:
        shutil.rmtree(s.docs.folder, ignore_errors=True)
