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

import functools
import logging
import threading
import time

import numpy as np

from polyindex.config import settings
from polyindex.errors import NotFound, ResourceExhausted
from polyindex.online.view import (Buffer, BufferedView, encode_array, remote_build,
                                   remove_segments)
from polyindex.online.wal import WriteAheadLog, disk_error
from polyindex.storage.shared_training import train_first, untrained
from polyindex.storage.snapshot import Snapshot
from polyindex.types import Document

# Seal when this many documents are buffered, or when the oldest buffered write is this old
# (settable per process, e.g. for `polyindex serve`, by environment variable).
SEAL_DOCS = settings().seal_docs
SEAL_SECONDS = settings().seal_seconds
# Unsealed documents beyond which writes are refused while sealing fails (memory is bounded
# by this, the WAL's disk use likewise); generous, so that a slow seal never trips it.
MAX_BACKLOG = settings().max_backlog or None
BACKOFF_S = (0.5, 30.0)  # first and longest wait between retries of a failed seal
log = logging.getLogger("polyindex.online")


class OnlineWrites(BufferedView):
    def __init__(self, table, seal_docs: int | None = None, seal_seconds: float | None = None):
        super().__init__(table, table.folder / "buffer")
        self.seal_docs = SEAL_DOCS if seal_docs is None else seal_docs
        self.seal_seconds = SEAL_SECONDS if seal_seconds is None else seal_seconds
        self.max_backlog = MAX_BACKLOG or max(50_000, 10 * self.seal_docs)
        self.closed = False
        self._tried_training = False
        self.seal_failures = 0          # consecutive failed seals (0: the last one worked)
        self.last_seal_error: str | None = None
        self._retry_at = 0.0
        self.seal_lock = threading.Lock()   # one seal at a time
        self.wal = WriteAheadLog(table.folder / "wal", after=self.base.manifest.wal_through)
        self._replay()
        try:  # files a crash left behind after their seal committed
            self.wal.drop_through(self.base.manifest.wal_through)
        except OSError as e:
            log.warning("%s: could not delete sealed WAL files: %s", table.name, e)
        self.on_sealed = lambda: None  # e.g. wakes the background merger
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sealer, name=f"seal-{table.name}", daemon=True)
        self._thread.start()

    # -- writes ----------------------------------------------------------------------------
    def upsert(self, docs: list[Document], embeddings: np.ndarray | None = None) -> int:
        # [id, title, text, metadata] + [vectors] when the document has vectors or tokens,
        # + [token matrix] when it has tokens (multivector:source=user). Arrays as base64
        # float32 (``encode_array``), not JSON numbers: a batch of 100 384-d vectors took
        # 26 ms of a 49 ms write to encode as numbers (and 5x the WAL bytes).
        record = {"op": "upsert", "docs": [[d.id, d.title, d.text, d.metadata] +
                                           ([{f: encode_array(v)
                                              for f, v in (d.vectors or {}).items()}]
                                            if d.vectors or d.tokens is not None else []) +
                                           ([encode_array(d.tokens)] if d.tokens is not None
                                            else [])
                                           for d in docs]}
        # before the WAL: an encoder failure acknowledges nothing
        given = embeddings is not None and self.needs_vectors
        generation = self.table.encoding.generation
        vectors = embeddings if given else self._encode(docs)
        if vectors is not None:  # followers and a replay reuse them (see online.view)
            record["emb"] = encode_array(vectors)
        if not self._tried_training and untrained(self.table.kinds):
            # the collection's artifacts from its first batch (storage.shared_training); tried
            # once per writer: a batch too small to train on leaves it to the first seal
            self._tried_training = True
            train_first(self.table, docs, vectors, self.spec.stack(docs) if self.spec else None)
        with self.lock:
            if not given and self.table.encoding.generation != generation:
                # an adapt committed a new encoder meanwhile (under this lock, with the buffer
                # sealed): encode again, so the buffer never mixes encoders
                vectors = self._encode(docs)
                record["emb"] = encode_array(vectors)
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
                remove_segments([seg])
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

    def delete_matching(self, select) -> int:
        """Delete the ids ``select(view)`` names (delete by filter), chosen under the write
        lock: no write lands between choosing them and deleting them."""
        with self.lock:
            self._check_writable(0)
            ids = select(self.view)
            if ids:
                self.active.through = self.wal.append({"op": "delete", "ids": ids})
                self._apply_delete(ids)
        return len(ids)

    def _check_writable(self, adding: int) -> None:
        if self.closed:
            raise NotFound(f"collection {self.table.name!r} was dropped or closed")
        backlog = len(self.active.docs) + (len(self.frozen.docs) if self.frozen else 0)
        if self.seal_failures and backlog + adding > self.max_backlog:
            raise ResourceExhausted(
                f"collection {self.table.name!r}: {backlog} acknowledged documents wait to be "
                f"sealed and sealing keeps failing ({self.seal_failures} attempts; last error: "
                f"{self.last_seal_error}); writes resume once a seal succeeds")

    def snapshot(self) -> Snapshot:
        """The current view; re-based when the manifest changed under us (a metadata commit
        of this process, e.g. a trained ranker). ``manifest_changed`` is rate-limited, so it
        is asked once; ``sealed_snapshot`` re-reads only a changed file."""
        if self.closed:
            raise NotFound(f"collection {self.table.name!r} was dropped or closed")
        # Not while a seal or merge commit is under way (it re-bases when done): a base
        # holding a seal's segment beside its frozen buffer would show those rows twice.
        if self.table.manifest_changed() and self.seal_lock.acquire(blocking=False):
            try:
                self.rebase()
            finally:
                self.seal_lock.release()
        return self.view

    def sealed_through_now(self) -> Snapshot:
        """A committed snapshot holding every write acknowledged before this call: the buffer
        is sealed first (writes that come meanwhile go to the next buffer; a seal that fails
        raises). Two seals at most: a frozen buffer retried first, then the newer writes."""
        with self.lock:
            target = self.wal.last_seq
        for _ in range(3):
            # Nothing buffered: every acknowledged write is committed (asked before the
            # manifest is read, so a seal finishing in between is in it).
            with self.lock:
                drained = self.frozen is None and self.active.empty()
            base = self.table.sealed_snapshot()
            if base.manifest.wal_through >= target or drained:
                return base
            self.seal()
        raise ResourceExhausted(f"collection {self.table.name!r}: the writes acknowledged "
                                "before the snapshot could not be sealed; try again")

    # -- sealing ---------------------------------------------------------------------------
    def seal(self, build=remote_build) -> None:
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
                                    self.table.name, e)
            frozen = self.frozen
            docs = list(frozen.docs.values())
            vectors = (np.stack([frozen.vectors[d.id] for d in docs])
                       if self.needs_vectors and docs else None)
            try:
                with self.table.writer() as w:
                    w.commit_segment(docs, self.table.config.fields, embeddings=vectors,
                                     delete_ids=sorted(frozen.deleted - frozen.docs.keys()),
                                     wal_through=frozen.through,
                                     vectors=self.spec.stack(docs) if self.spec else None,
                                     build=build)
            except BaseException as e:
                self.seal_failures += 1
                self.last_seal_error = f"{type(e).__name__}: {e}"
                wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self.seal_failures - 1))
                self._retry_at = time.monotonic() + wait
                log.error("%s: sealing %d documents failed (attempt %d, retry in %.1f s): %s",
                          self.table.name, len(docs), self.seal_failures, wait,
                          self.last_seal_error)
                raise
            self.seal_failures, self.last_seal_error, self._retry_at = 0, None, 0.0
            with self.lock:
                self.frozen = None
                self.base = self.table.sealed_snapshot()
                self._rehide_all()
                self._publish()
            try:
                self.wal.drop_through(frozen.through)
            except OSError as e:  # harmless: replay skips records at or below wal_through
                log.warning("%s: could not delete sealed WAL files: %s", self.table.name, e)
            remove_segments(frozen.segments)
            self.on_sealed()

    def rebase(self) -> None:
        """Compose the buffer over the newest committed manifest (the caller holds
        ``seal_lock``, so no seal is half done)."""
        with self.lock:
            base = self.table.sealed_snapshot()
            if base is not self.base:
                self.base = base
                self._rehide_all()
                self._publish()

    def _due(self) -> bool:
        if self.frozen is not None:  # a failed seal: retry after its backoff
            # (not a seal still under way: the sealer would wait for it, then seal the
            # writes that came meanwhile, a seal nobody asked for, at a moment of its timing)
            return self.seal_failures > 0 and time.monotonic() >= self._retry_at
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
        records = list(self.wal.replay())
        if records:
            self.active.through = self.wal.last_seq
            self.apply_records(records)

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
        self.indexer.stop()
        build = functools.partial(remote_build, here_if_cold=True)
        try:
            self.seal(build)
            if self.frozen is None and not self.active.empty():
                self.seal(build)  # a retried frozen buffer went first; now the newer writes
        finally:
            with self.lock:
                self.closed = True
                self.wal.close()

    def abandon(self) -> None:
        """For a drop: stop the sealer, wait for an in-flight seal, close the WAL; nothing
        is sealed and every later call answers NotFound."""
        self._stop.set()
        self._thread.join()
        self.indexer.stop()
        with self.seal_lock, self.lock:
            self.closed = True
            self.wal.close()


