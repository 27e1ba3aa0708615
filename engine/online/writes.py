"""Online writes: WAL-acknowledged upserts and deletes, searchable at once, sealed later.

Each acknowledged write batch becomes a small in-memory *buffer segment* built by the same
kinds' ``build`` as a sealed one (so its scores are computed the same way) and is composed
into the collection's snapshot together with the rows it hides in older segments. A
background thread seals the buffer into a real segment by size or age (one manifest commit
with the buffered deletes), then drops the WAL files it covered. On open, the WAL is replayed.
"""
from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from typing import Sequence

import numpy as np
import pyarrow as pa

from polyindex.online.wal import WriteAheadLog
from polyindex.storage.manifest import SegmentEntry
from polyindex.storage.snapshot import OpenedSegment, Snapshot
from polyindex.storage.writer import build_segment
from polyindex.types import Document, document_text

# Seal when this many documents are buffered, or when the oldest buffered write is this old
# (settable per process, e.g. for `polyindex serve`, by environment variable).
SEAL_DOCS = int(os.environ.get("POLYINDEX_SEAL_DOCS", 5_000))
SEAL_SECONDS = float(os.environ.get("POLYINDEX_SEAL_SECONDS", 30.0))
MAX_BUFFER_SEGMENTS = 8  # more small buffer segments than this are merged into one


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
        self.needs_vectors = any(k.needs_embeddings for k in coll.kinds.values())
        self.scratch = coll.folder / "buffer"
        shutil.rmtree(self.scratch, ignore_errors=True)  # buffer segments are rebuilt from the WAL
        self.scratch.mkdir()
        self._names = itertools.count()
        self.lock = threading.RLock()       # serializes writes and snapshot swaps
        self.seal_lock = threading.Lock()   # one seal at a time
        self.active, self.frozen = Buffer(), None
        self.base: Snapshot = coll.sealed_snapshot()
        self.overlay: list[np.ndarray] = []
        self._rehide_all()
        self.view: Snapshot = self.base
        self.wal = WriteAheadLog(coll.folder / "wal")
        self._replay()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sealer, name=f"seal-{coll.name}", daemon=True)
        self._thread.start()

    # -- writes ----------------------------------------------------------------------------
    def upsert(self, docs: list[Document]) -> int:
        record = {"op": "upsert", "docs": [[d.id, d.title, d.text, d.metadata] for d in docs]}
        vectors = self._encode(docs)  # before the WAL: an encoder failure acknowledges nothing
        with self.lock:
            self.wal.append(record)
            self._apply_upsert(docs, vectors)
        return len(docs)

    def delete(self, ids: list[str]) -> int:
        with self.lock:
            n = sum(loc is not None for loc in self.view.find(ids))
            self.wal.append({"op": "delete", "ids": ids})
            self._apply_delete(ids)
        return n

    def _encode(self, docs: Sequence[Document]):
        if not self.needs_vectors or not docs:
            return None
        return self.coll.encoder.encode([document_text(d.title, d.text) for d in docs])

    def _apply_upsert(self, docs, vectors) -> None:
        seg = self._build(docs, vectors)
        self.active.add_segment(seg, docs, vectors)
        self._hide(pa.array([d.id for d in docs], pa.string()))
        if len(self.active.segments) > MAX_BUFFER_SEGMENTS:
            self._merge_active()
        self._publish()

    def _apply_delete(self, ids) -> None:
        self.active.delete(ids)
        self._hide(pa.array(ids, pa.string()))
        self._publish()

    def _build(self, docs, vectors) -> OpenedSegment:
        folder = self.scratch / f"buf-{next(self._names):08d}"
        infos = build_segment(folder, docs, self.coll.config.fields, self.coll.kinds, vectors)
        return OpenedSegment(folder, SegmentEntry(folder.name, len(docs), infos), self.coll.kinds)

    def _merge_active(self) -> None:
        """Many small buffer segments cost per-query overhead: rebuild them as one."""
        old = self.active
        docs = list(old.docs.values())
        merged = Buffer()
        merged.deleted, merged.started = set(old.deleted), old.started
        if docs:
            vectors = np.stack([old.vectors[d.id] for d in docs]) if self.needs_vectors else None
            merged.add_segment(self._build(docs, vectors), docs, vectors)
            merged.deleted = set(old.deleted)
        self.active = merged
        _remove(old.segments)

    # -- snapshots -------------------------------------------------------------------------
    def _hide(self, ids: pa.Array) -> None:
        """Rows of sealed segments (and of the frozen buffer) that these ids replace."""
        self.overlay = [ov | seg.docs.contains(ids) for ov, seg in zip(self.overlay, self._under())]

    def _under(self) -> list[OpenedSegment]:
        return self.base.segments + (self.frozen.segments if self.frozen else [])

    def _rehide_all(self) -> None:
        under = self._under()
        self.overlay = [np.zeros(s.docs.n_rows, dtype=bool) for s in under]
        hidden = self.active.hidden_ids()
        if self.frozen is not None:
            hidden_base = pa.array(self.frozen.hidden_ids() + hidden, pa.string())
            n_base = len(self.base.segments)
            for i, s in enumerate(under):
                self.overlay[i] = s.docs.contains(hidden_base if i < n_base else
                                                   pa.array(hidden, pa.string()))
        elif hidden:
            self._hide(pa.array(hidden, pa.string()))

    def _publish(self) -> None:
        live = []
        for mask, ov in zip(self.base.live + (self.frozen.live if self.frozen else []), self.overlay):
            live.append(mask if not ov.any() else (~ov if mask is None else mask & ~ov))
        segments = self._under() + self.active.segments
        self.view = Snapshot(self.base.manifest, self.coll.kinds, segments,
                             live + list(self.active.live))

    def snapshot(self) -> Snapshot:
        """The current view; re-based when the manifest changed behind our back (bulk index)."""
        if self.coll.manifest_changed():
            with self.lock:
                if self.coll.manifest_changed():
                    self.base = self.coll.sealed_snapshot()
                    self._rehide_all()
                    self._publish()
        return self.view

    # -- sealing ---------------------------------------------------------------------------
    def seal(self) -> None:
        """Commit the buffered writes as one segment, then forget the WAL that held them."""
        with self.seal_lock:
            with self.lock:
                if self.active.empty():
                    return
                self.frozen, self.active = self.active, Buffer()
                through = self.wal.rotate()
                self._rehide_all()
                self._publish()
            frozen = self.frozen
            docs = list(frozen.docs.values())
            vectors = (np.stack([frozen.vectors[d.id] for d in docs])
                       if self.needs_vectors and docs else None)
            with self.coll.writer() as w:
                w.commit_segment(docs, self.coll.config.fields, embeddings=vectors,
                                 delete_ids=sorted(frozen.deleted - frozen.docs.keys()))
            with self.lock:
                self.frozen = None
                self.base = self.coll.sealed_snapshot()
                self._rehide_all()
                self._publish()
            self.wal.drop_through(through)
            _remove(frozen.segments)

    def _sealer(self) -> None:
        while not self._stop.wait(0.2):
            a = self.active
            if a.started is not None and (len(a.docs) >= self.seal_docs or
                                          time.monotonic() - a.started >= self.seal_seconds):
                try:
                    self.seal()
                except Exception:  # noqa: BLE001 - retried on the next tick; the WAL holds the data
                    import logging
                    logging.getLogger("polyindex").exception("sealing %s failed", self.coll.name)

    def _replay(self) -> None:
        docs: dict[str, Document] = {}
        deleted: set[str] = set()
        for rec in self.wal.replay():
            if rec["op"] == "upsert":
                for i, t, x, m in rec["docs"]:
                    docs.pop(i, None)
                    docs[i] = Document(i, t, x, m)
                    deleted.discard(i)
            else:
                for i in rec["ids"]:
                    docs.pop(i, None)
                    deleted.add(i)
        if not docs and not deleted:
            return
        if deleted:
            self._apply_delete(sorted(deleted))
        if docs:
            batch = list(docs.values())
            self._apply_upsert(batch, self._encode(batch))

    def pending(self) -> dict:
        return {"buffered_docs": len(self.active.docs) + (len(self.frozen.docs) if self.frozen else 0),
                "buffered_deletes": len(self.active.deleted), "wal_bytes": self.wal.size_bytes()}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.seal()
        self.wal.close()


def _remove(segments: list[OpenedSegment]) -> None:
    # Memory-mapped files stay readable for queries still holding them (POSIX unlink).
    for s in segments:
        shutil.rmtree(s.docs.folder, ignore_errors=True)
