"""The composed view of online writes: sealed segments with buffered writes over them.

Shared by the writer (``online.writes.OnlineWrites``: its WAL-acknowledged buffer) and by a
read-only follower (``online.follow.WalFollower``: the writer's WAL records it tails). Each
write batch becomes a small *buffer segment* built by the same kinds' ``build`` as a sealed
one (so scores are computed the same way), and the rows it replaces or deletes in older
segments are hidden by per-segment masks (new arrays: published snapshots keep theirs).

WAL records carry the model embeddings of upserted documents (``emb``) so that a follower
and a replay build the very vectors the writer acknowledged (a text's bf16 embedding depends
slightly on its batch) without running the model again; older records without them are
encoded.
"""
from __future__ import annotations

import base64
import itertools
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from polyindex.index.dense.stack import FIELD, Stack, cached_prepare
from polyindex.index.masks import freeze
from polyindex.index.protocol import DocTokens
from polyindex.online import buffer_index
from polyindex.storage import build_worker, idindex
from polyindex.storage.manifest import SegmentEntry
from polyindex.storage.snapshot import OpenedSegment, Snapshot
from polyindex.storage.writer import build_segment
from polyindex.types import Document, document_text

MAX_BUFFER_SEGMENTS = 8  # more small buffer segments than this are merged into one
log = logging.getLogger("polyindex.online")


class Buffer:
    """Writes since the last seal: latest version of each id, deleted ids, their segments."""

    def __init__(self):
        self.docs: dict[str, Document] = {}
        self.vectors: dict[str, np.ndarray] = {}
        self.deleted: set[str] = set()
        self.segments: list[OpenedSegment] = []
        # None while every row of the segment is live: a query then searches its index
        # directly, with no mask to derive a bitmap from on each new snapshot
        self.live: list[np.ndarray | None] = []
        self.where: dict[str, tuple[int, int]] = {}
        self.stack = Stack()  # the segments' dense vectors as one matrix (the vector lane's)
        self.started: float | None = None
        self.through = 0  # WAL sequence number of the last write in this buffer

    def empty(self) -> bool:
        return not self.docs and not self.deleted

    def hidden_ids(self) -> list[str]:
        """Ids whose older rows this buffer hides (upserted or deleted here)."""
        return list(self.docs.keys() | self.deleted)

    def add_segment(self, seg: OpenedSegment, docs: Sequence[Document], vectors,
                    stack: bool = True) -> None:
        s = len(self.segments)
        self.segments.append(seg)
        self.live.append(None)
        if stack:
            self.stack.add(seg)
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
            seg, row = old
            mask = self.live[seg]  # a new array: published snapshots keep the old mask
            mask = np.ones(self.segments[seg].docs.n_rows, bool) if mask is None else mask.copy()
            mask[row] = False
            self.live[seg] = mask


class BufferedView:
    """``base`` (a sealed snapshot), an optional ``frozen`` buffer being sealed and the
    ``active`` buffer, composed into ``view``; buffer segments are built under ``scratch``."""

    def __init__(self, table, scratch: Path):
        self.table = table  # ``storage.table.Table``
        # model embeddings are encoded here; user vectors travel on the documents
        self.needs_vectors = table.encoding.encodes_text() and any(
            k.needs_embeddings for k in table.kinds.values())
        self.spec = table.encoding.vector_spec()
        self.scratch = scratch
        shutil.rmtree(self.scratch, ignore_errors=True)  # buffer segments are rebuilt from the WAL
        self.scratch.mkdir(parents=True)
        self._names = itertools.count()
        self.lock = threading.RLock()       # serializes writes and snapshot swaps
        self.active, self.frozen = Buffer(), None
        self.base: Snapshot = table.sealed_snapshot()
        self.overlay: list[np.ndarray | None] = []
        self.combined: list[np.ndarray | None] = []
        kind = table.kinds.get(FIELD)
        # the dense `auto` rule's graph for the buffer too (``online.buffer_index``)
        self.graph_auto = kind is not None and kind.kind == FIELD and kind._auto()
        self.indexer = buffer_index.BufferIndexer(self)
        self._rehide_all()
        self.view: Snapshot = self.base

    def _encode(self, docs: Sequence[Document]):
        if not self.needs_vectors or not docs:
            return None
        return self.table.encoding.encoder.encode([document_text(d.title, d.text) for d in docs])

    def apply_records(self, records) -> None:
        """Apply WAL records (in order) to the active buffer as one delete and one upsert:
        their net effect, the embeddings they carry reused (the others encoded)."""
        docs, stored, deleted = net_changes(records)
        if deleted:
            self._apply_delete(sorted(deleted))
        if docs:
            batch = list(docs.values())
            self._apply_upsert(batch, self._vectors_for(batch, stored))

    def _vectors_for(self, docs: Sequence[Document], stored: dict[str, np.ndarray]):
        if not self.needs_vectors:
            return None
        missing = [d for d in docs if d.id not in stored]
        if missing:
            stored = {**stored, **dict(zip([d.id for d in missing], self._encode(missing)))}
        return np.stack([stored[d.id] for d in docs]).astype(np.float32, copy=False)

    def _apply_upsert(self, docs, vectors) -> None:
        self._add_built(self._build(docs, vectors), docs, vectors)

    def _add_built(self, seg: OpenedSegment, docs, vectors) -> None:
        self.active.add_segment(seg, docs, vectors)
        self._hide([d.id for d in docs])
        if len(self.active.segments) > MAX_BUFFER_SEGMENTS:
            try:
                self._merge_active()
            except Exception as e:  # noqa: BLE001 - only slower queries until the next seal
                log.warning("%s: merging buffer segments failed: %s", self.table.name, e)
        self._publish()
        self.indexer.poke()

    def _apply_delete(self, ids) -> None:
        self.active.delete(ids)
        self._hide(list(ids))
        self._publish()

    def _build(self, docs, vectors, remote: bool = False) -> OpenedSegment:
        folder = self.scratch / f"buf-{next(self._names):08d}"
        infos = (remote_build if remote else build_segment)(
            folder, docs, self.table.config.fields, self.table.kinds, vectors,
            vectors=self.spec.stack(docs) if self.spec else None)
        return OpenedSegment(folder, SegmentEntry(folder.name, len(docs), infos), self.table.kinds)

    def _merge_active(self) -> None:
        """Many small buffer segments cost per-query overhead: rebuild them as one."""
        old = self.active
        docs = list(old.docs.values())
        merged = Buffer()
        merged.deleted, merged.started, merged.through = set(old.deleted), old.started, old.through
        if docs:
            vectors = np.stack([old.vectors[d.id] for d in docs]) if self.needs_vectors else None
            merged.add_segment(self._build(docs, vectors, remote=True), docs, vectors,
                               stack=False)
            merged.deleted = set(old.deleted)
            # the same rows under new keys: the stacked vectors and their graph carry over
            starts = np.cumsum([0] + [s.docs.n_rows for s in old.segments])
            new_key = np.full(int(starts[-1]), -1, np.int64)
            new_key[[starts[old.where[d.id][0]] + old.where[d.id][1] for d in docs]] = \
                np.arange(len(docs))
            merged.stack = old.stack
            merged.stack.remap(new_key, len(docs))
        self.active = merged
        remove_segments(old.segments)


    # -- snapshots ---------------------------------------------------------------------------
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
            before = self.combined[i]
            rows = np.unique(rows)
            hidden = rows if before is None else rows[before[rows]]  # live until now
            self.overlay[i][rows] = True
            mask = base_live[i]
            live = freeze(~self.overlay[i] if mask is None else mask & ~self.overlay[i])
            self.combined[i] = live
            for name, index in under[i].indexes.items():
                try:
                    index.prepare_live(live, before, hidden)
                except Exception as e:  # noqa: BLE001 - the next query builds it instead
                    log.warning("%s: preparing %s for a new live mask failed: %s",
                                self.table.name, name, e)

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

    # -- the buffer's graph (``online.buffer_index``) ------------------------------------------
    def graph_job(self, peek: bool = False):
        """(stack, its matrix, rows to index through) when the active buffer's graph should
        grow, else None."""
        with self.lock:
            stack = self.active.stack
            if not buffer_index.wanted(self, stack, int(self.base.bases[-1])):
                return None
            return True if peek else (stack, stack.matrix(), stack.rows)

    def publish_graph(self, stack, graph, upto: int) -> None:
        with self.lock:
            if upto <= stack.indexed or (stack is not self.active.stack and (
                    self.frozen is None or stack is not self.frozen.stack)):
                return  # sealed or merged away meanwhile
            stack.graph, stack.indexed = graph, upto
            self._publish()

    def _publish(self) -> None:
        segments = self._under() + self.active.segments
        stacks, at = {}, len(self.base.segments)
        for buf in ([self.frozen] if self.frozen else []) + [self.active]:
            stack = buf.stack.view()
            if stack is not None and stack.segments == len(buf.segments) and \
                    stack.keys == sum(s.docs.n_rows for s in buf.segments):
                stacks[at] = stack
            at += len(buf.segments)
        view = Snapshot(self.base.manifest, self.table.kinds, segments,
                        self.combined + list(self.active.live), stacks)
        for i, stack in stacks.items():  # the stacks' live rows and bitmaps, for the queries
            covered = [s.indexes[FIELD] for s in segments[i:i + stack.segments]]
            cached_prepare(view, i, stack, covered, view.live[i:i + stack.segments])
        self.view = view


def net_changes(records: Iterable[tuple[int, dict]]):
    """The net effect of WAL records, in order: (latest document of each upserted id, its
    stored embedding where the record carried one, ids deleted and not upserted since)."""
    docs: dict[str, Document] = {}
    stored: dict[str, np.ndarray] = {}
    deleted: set[str] = set()
    for _seq, rec in records:
        if rec["op"] == "upsert":
            emb = decode_array(rec["emb"]) if "emb" in rec else None
            for row, (i, t, x, m, *v) in enumerate(rec["docs"]):
                docs.pop(i, None)
                stored.pop(i, None)
                # [id, title, text, metadata] + [vectors] + [token matrix] (online.writes)
                docs[i] = Document(i, t, x, m, {f: record_array(a) for f, a in v[0].items()}
                                   if v and v[0] else None,
                                   record_array(v[1]) if len(v) > 1 else None)
                if emb is not None:
                    stored[i] = emb[row]
                deleted.discard(i)
        else:
            for i in rec["ids"]:
                docs.pop(i, None)
                stored.pop(i, None)
                deleted.add(i)
    return docs, stored, deleted


def encode_array(a: np.ndarray) -> dict:
    """A float32 matrix as JSON: exact, about 5.3 bytes per value (base64)."""
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "f4": base64.b64encode(a.tobytes()).decode("ascii")}


def record_array(a) -> np.ndarray:
    """A document's vector or token matrix from a WAL record: ``encode_array``'s form, or a
    JSON list of numbers (records written before stop 31)."""
    if isinstance(a, dict):
        return decode_array(a).copy()  # writable, as the list form gives
    return np.asarray(a, np.float32)


def decode_array(d: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["f4"]), dtype="<f4").reshape(d["shape"])


def remote_build(folder, docs, fields, kinds, embeddings, tokens=None, vectors=None,
                 collection_rows: int = 0, quality=None, pruned=None, *,
                 here_if_cold: bool = False) -> dict:
    """``build_segment`` in the build process (off this process's GIL: queries beside a seal
    keep their latency), or here when build processes are off, or when ``here_if_cold`` and
    the build process is not up (the seal at close: no query is left to protect, and a
    process start costs more than a small seal)."""
    if not build_worker.enabled() or (here_if_cold and not build_worker.running("seal")):
        return build_segment(folder, docs, fields, kinds, embeddings, tokens, vectors,
                             collection_rows, quality, pruned)
    # As columns: pickling 5,000 Document objects (with their vectors) took ~40 ms of GIL,
    # the columns ~1 ms; the stacked vectors travel once.
    columns = ([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
               [d.metadata for d in docs])
    if tokens is None and docs and docs[0].tokens is not None:  # multivector:source=user
        tokens = [DocTokens(d.tokens) for d in docs]
    return build_worker.run("seal", "polyindex.storage.writer:build_segment_columns", folder,
                            columns, fields, kinds, embeddings, tokens, vectors,
                            collection_rows, quality, pruned)


def remove_segments(segments: list[OpenedSegment]) -> None:
    # Memory-mapped files stay readable for queries still holding them (POSIX unlink).
    for s in segments:
        shutil.rmtree(s.docs.folder, ignore_errors=True)
