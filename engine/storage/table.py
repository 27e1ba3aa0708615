"""A collection's storage: its manifest and snapshots, opened segments, kinds, the writer and
its lock, garbage collection and trained metadata. Bulk ingest, online writes, the follower
and compaction take this object; ``Collection`` is the user API over it.

How writes encode documents is handed in (``encoding``: ``ingest.encoding.Encoding``, or
anything with its ``document_encoder``, ``encodes_text``, ``vector_spec`` and ``assess``):
storage imports only ``index``."""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from polyindex.config import CollectionConfig
from polyindex.errors import Corrupt, FailedPrecondition, InvalidArgument, NotFound
from polyindex.index.protocol import IndexKind
from polyindex.index.registry import from_factory
from polyindex.storage import encoders, gc
from polyindex.storage.manifest import MANIFEST, load_manifest
from polyindex.storage.snapshot import OpenedSegment, Snapshot
from polyindex.storage.writer import Writer, writer_lock

RECHECK_S = 0.05  # how stale a reader may be about commits made by other processes


class Table:
    def __init__(self, folder: Path, device: str = "cpu", readonly: bool = False,
                 token_encoder=None, dir_lock=None):
        """``token_encoder(model, dtype, device)``: the collection model's token encoder,
        for kinds that encode (a plain function: the kinds hold no reference back)."""
        self.folder = folder
        # The engine's data-directory lock, kept alive while this table can write (held by
        # the sealer and merger too: a table outliving its engine must not let a second
        # writer in); dropped at close.
        self.dir_lock = dir_lock
        self.readonly = readonly
        self.name = folder.name
        self.device = device
        self.closed = False
        self._folder_id = folder_id(folder)
        self._id_checked = time.monotonic()  # when the folder was last seen to be this one
        self._replaced = False  # reading its files found it dropped or created again
        manifest = load_manifest(folder)
        self.config: CollectionConfig = manifest.config
        self.uid = self.config.uid
        # (model, fingerprint) of the encoder the newest manifest names (an adapted one:
        # ``storage.encoders``); a one-item list the kinds' token encoder reads at each call
        self.encoder_now = [encoders.model_of(folder, manifest)]
        # Keyed by index name: the kind ("dense", "lexical") or a named field ("dense@image").
        self.kinds: dict[str, IndexKind] = {}
        for factory in self.config.indexes:
            try:
                kind = from_factory(factory)
            except InvalidArgument as e:  # it was valid when the collection was created
                raise Corrupt(f"{folder / MANIFEST}: stored index {factory!r}: {e}") from e
            kind.attach(device=device, token_encoder=partial(
                token_encoder, self.config.model, self.config.dtype, device,
                current=self.encoder_now))
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
        self._manifest_path = str(folder / MANIFEST)
        # Files later commits stopped naming that a live snapshot still pinned (retried after
        # the next commit), and whether this writer has swept for a crash's leftovers yet.
        self._garbage: set[str] = set()
        self._swept = False
        self.merge_stats = {"merges": 0, "merge_failures": 0, "last_merge_error": None,
                            "merging": [], "rows_merged": 0, "rows_reclaimed": 0}
        self.encoding = None  # set by whoever composes the table (``Collection``)
        # called when the stored config changed (the facade's parsed profiles are stale)
        self.on_config_change = lambda: None

    # -- snapshots -------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The newest committed snapshot (no buffered writes), checked for a change at most
        every ``RECHECK_S``."""
        if self.closed:
            raise NotFound(f"collection {self.name!r} was dropped or closed")
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
            raise self._gone(f"collection {self.name!r} was dropped") from None
        return (st.st_mtime_ns, st.st_size, st.st_ino) != self._stamp

    def is_current(self) -> bool:
        """Is this still the collection at its path (not dropped, not re-created)? Looked at
        at most every ``RECHECK_S``, the bound on a reader's view of the writer's commits (a
        stat per query is measurable; a reader that forwarded a drop itself forgets the
        handle at once: ``Engine.forget``)."""
        if self.closed or self._replaced:
            return False
        now = time.monotonic()
        if now - self._id_checked < RECHECK_S:
            return True
        if folder_id(self.folder) != self._folder_id:
            return False
        self._id_checked = now
        return True

    def _gone(self, message: str) -> NotFound:
        """The error for a dropped (or re-created) collection, seen by reading its files: from
        now on ``is_current`` says so, and the engine opens the new one (a re-created folder
        may even have the old one's inode)."""
        self._replaced = True
        return NotFound(message)

    def sealed_snapshot(self) -> Snapshot:
        """The newest committed manifest's snapshot (re-read only when the file changed)."""
        with self._lock:
            try:
                st = os.stat(self._manifest_path)
            except FileNotFoundError:
                raise self._gone(f"collection {self.name!r} was dropped") from None
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
            raise self._gone(f"collection {self.name!r} was dropped") from None

    def _load_snapshot(self) -> None:
        """Read the manifest and open what is new in it (under ``self._lock``)."""
        # A reader's failpoints are its own (``follow.*``): one process may hold a writer too
        point = "follow" if self.readonly else "snapshot"
        manifest = load_manifest(self.folder, f"{point}.manifest")
        if manifest.config.uid != self.uid:
            raise self._gone(f"collection {self.name!r} was dropped (and created again)")
        self._follow_encoder(manifest)
        if manifest.config != self.config:  # e.g. train-ranker or tune-bm25 elsewhere
            self.config = manifest.config
            self.on_config_change()
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

    def refresh(self) -> None:
        self._stamp = None

    def _follow_encoder(self, manifest) -> None:
        """Writes and the kinds encode with the encoder ``manifest`` names from now on."""
        self.encoder_now[0] = encoders.model_of(self.folder, manifest)
        if self.encoding is not None:
            self.encoding.follow(self.encoder_now[0])

    def release(self) -> None:
        """Let go of opened segments: a closed handle pins no file against collection."""
        with self._lock:
            self._snapshot = None
            self._opened.clear()
            self._tombstones.clear()

    def _tune_kinds(self) -> None:
        """The lexical kind scores with the collection's tuned BM25 (``config.lexical_params``,
        from ``tune-bm25``), else with its factory string's."""
        lex = self.kinds.get("lexical")
        if lex is not None:
            factory = next(f for f in self.config.indexes if f.partition(":")[0].strip() == "lexical")
            lex.set_scorer(self.config.lexical_params or factory.partition(":")[2].strip())

    # -- writes ----------------------------------------------------------------------------
    @contextmanager
    def writer(self):
        if self.readonly:
            raise FailedPrecondition(f"collection {self.name!r} is open read-only")
        if self.closed:
            raise NotFound(f"collection {self.name!r} was dropped or closed")
        with self._write_lock, writer_lock(self.folder):
            w = Writer(self.folder, self.kinds, self.encoding.document_encoder(),
                       open_segment=self._opened_docs)
            if w.manifest.config.uid != self.uid:
                raise self._gone(f"collection {self.name!r} was dropped (and created again)")
            # the encoder the manifest it commits over names (an adapt elsewhere switched it)
            self._follow_encoder(w.manifest)
            # Document quality where it is worth its cost: a collection that runs its model
            # on the text (~80 us a document beside ~50 ms of encoding; a lexical-only
            # ingest would be ~30% slower) or that prunes. Holds the folder, not the
            # collection: no reference cycle through the writer.
            if self.encoding.encodes_text() or w.manifest.config.prune_threshold is not None:
                w.quality = partial(self.encoding.assess, self.folder)
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

    # -- collection-level metadata ---------------------------------------------------------
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
        self.on_config_change()
        self._tune_kinds()
        self.refresh()


def has_wal(folder: Path) -> bool:
    wal = folder / "wal"
    return wal.is_dir() and any(p.stat().st_size for p in wal.glob("wal-*.log"))


def folder_id(folder: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
