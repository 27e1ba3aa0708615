"""The embedded engine: a data directory holding named collections.

A writing engine holds the data directory's lock for its lifetime (one writer per directory,
across processes); ``readonly=True`` takes no lock, refuses writes and follows the manifests
the writer commits. Collections have a lifecycle: each incarnation of a name has its own id,
a drop closes the collection (its sealer stopped, its WAL closed) before the folder goes, and
create and drop are serialized, so a create racing itself makes one collection.
"""
from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Sequence

from polyindex.collection import Collection
from polyindex.config import (
    DEFAULT_INDEXES,
    DEFAULT_MODEL,
    CollectionConfig,
    check_declared,
    validate_name,
)
from polyindex.cuda.device import check_device
from polyindex.errors import AlreadyExists, FailedPrecondition, NotFound, did_you_mean
from polyindex.index.registry import from_factory
from polyindex.storage import fsutil
from polyindex.storage.lock import DirectoryLock
from polyindex.storage.manifest import MANIFEST, Manifest, commit_manifest

log = logging.getLogger("polyindex")
_LEFTOVERS = (".creating", ".dropping")  # dot-folders of an interrupted create or drop


class Engine:
    def __init__(self, path: str | Path, device: str = "cpu", create: bool = True,
                 online: bool = False, readonly: bool = False, follow_wal: bool = True):
        """``online=True`` is the serving mode: writes go through a write-ahead log and an
        in-memory buffer sealed into segments in the background (see ``polyindex.online``).
        ``readonly=True``: no lock and no writes; new commits of the writer are followed, and
        (``follow_wal``) so are its acknowledged writes not yet sealed (``online.follow``)."""
        self.path = Path(path)
        self.readonly = readonly
        self.follow_wal = follow_wal
        self.online = online and not readonly
        self.device = check_device(device)
        if not self.path.is_dir():
            if self.path.exists():
                raise FailedPrecondition(f"data directory {self.path} is not a directory")
            if not create or readonly:
                raise NotFound(f"data directory {self.path} does not exist")
            self.path.mkdir(parents=True)
        self._dir_lock = None if readonly else DirectoryLock(self.path)
        self._collections: dict[str, Collection] = {}
        self._lock = threading.RLock()  # serializes create, drop and opening collections
        if not readonly:
            self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        for p in self.path.iterdir():
            if p.name.startswith(".") and any(x in p.name for x in _LEFTOVERS) and p.is_dir():
                fsutil.rmtree(p, "recover")

    def _writable(self) -> None:
        if self.readonly:
            raise FailedPrecondition(f"data directory {self.path} is open read-only")
        if self._dir_lock is None:
            raise FailedPrecondition(f"the engine over {self.path} is closed")

    def list_collections(self) -> list[str]:
        # Dot-folders are never collections (names cannot start with '.').
        return sorted(p.name for p in self.path.iterdir()
                      if not p.name.startswith(".") and (p / MANIFEST).exists())

    def create_collection(self, name: str, indexes: Sequence[str] = DEFAULT_INDEXES, *,
                          model: str | None = DEFAULT_MODEL, dtype: str = "auto",
                          segment_size: int = 50_000, fields: dict[str, str] | None = None,
                          profiles: dict[str, dict] | None = None,
                          exist_ok: bool = False) -> Collection:
        validate_name(name)
        self._writable()
        kinds = [from_factory(f) for f in indexes]  # validates factory strings up front
        uid = uuid.uuid4().hex
        from polyindex.ingest.vectors import VectorSpec
        VectorSpec.of({k.name: k for k in kinds}, model)  # e.g. source=model without a model
        from polyindex.encode.precision import resolve
        dtype, dtype_choice = resolve(dtype, self.device)  # "auto": this machine's, stored
        config = CollectionConfig(name=name, indexes=[k.describe() for k in kinds], model=model,
                                  dtype=dtype, dtype_choice=dtype_choice, segment_size=segment_size, fields=dict(fields or {}),
                                  profiles=dict(profiles or {}), uid=uid)
        if profiles:
            from polyindex.query.profiles import Profile
            for pname, p in profiles.items():
                validate_name(pname, "profile")
                Profile.from_json(pname, p, {k.name for k in kinds})
        with self._lock:
            folder = self.path / name
            if (folder / MANIFEST).exists():
                if exist_ok:
                    coll = self.collection(name)
                    check_declared(name, coll.config.fields, config.fields)
                    return coll
                raise AlreadyExists(f"collection {name!r} already exists")
            # Build the collection in a temporary folder and rename it in: all or nothing.
            tmp = self.path / f".{name}.creating-{uid}"
            try:
                for sub in ("segments", "tombstones", "artifacts"):
                    fsutil.mkdir(tmp / sub, "create", parents=True)
                commit_manifest(tmp, Manifest(config=config))
                for sub in ("segments", "tombstones", "artifacts"):
                    fsutil.fsync_dir(tmp / sub, "create")
                fsutil.fsync_dir(tmp, "create")
                if folder.exists():  # a leftover without a manifest (crashed create): replace it
                    fsutil.rmtree(folder, "create")
                fsutil.rename(tmp, folder, "create")
                fsutil.fsync_dir(self.path, "create")
            except BaseException:
                fsutil.rmtree(tmp, "create.undo")
                raise
            return self.collection(name)

    def collection(self, name: str) -> Collection:
        validate_name(name)
        with self._lock:
            coll = self._collections.get(name)
            if coll is not None and self.readonly and not coll.table.is_current():
                self._collections.pop(name, None)  # dropped (and maybe re-created) by the writer
                coll.close()
                coll = None
            if coll is None:
                folder = self.path / name
                if not (folder / MANIFEST).exists():
                    have = self.list_collections()
                    raise NotFound(f"collection {name!r} not found{did_you_mean(name, have)} "
                                   f"(have: {', '.join(have) or 'none'})")
                coll = Collection(folder, self.device, online=self.online,
                                  readonly=self.readonly, dir_lock=self._dir_lock,
                                  follow_wal=self.follow_wal)
                self._collections[name] = coll
            return coll

    def forget(self, name: str) -> None:
        """A reader's cached handle of ``name`` is closed, so that the next ``collection``
        opens what the folder holds now: a drop or create this process asked the writer for
        (a group's follower forwards them) shows on its next call, not within ``RECHECK_S``."""
        if not self.readonly:
            raise FailedPrecondition("forget: only a read-only engine caches others' writes")
        with self._lock:
            coll = self._collections.pop(name, None)
        if coll is not None:
            coll.close()

    def drop_collection(self, name: str) -> None:
        validate_name(name)
        self._writable()
        with self._lock:
            folder = self.path / name
            if not (folder / MANIFEST).exists():
                raise NotFound(f"collection {name!r} not found"
                               f"{did_you_mean(name, self.list_collections())}")
            coll = self._collections.pop(name, None)
            if coll is not None:
                coll.abandon()  # sealer stopped, in-flight seal awaited, WAL closed
            tomb = self.path / f".{name}.dropping-{uuid.uuid4().hex}"
            fsutil.rename(folder, tomb, "drop")  # atomic: the collection disappears at once
            fsutil.fsync_dir(self.path, "drop")
            fsutil.rmtree(tomb, "drop")

    def restore_snapshot(self, path: str | Path, name: str | None = None, *,
                         force: bool = False, progress=None) -> dict:
        """Restore the snapshot at ``path`` (``Collection.snapshot``) as the collection ``name``
        (default: the snapshot's); every file is verified first (``storage.restore``). An
        existing collection of that name is refused unless ``force`` (then it is dropped,
        once the restored copy is complete). ``progress(phase, done, total)``: bytes checked,
        then copied."""
        from polyindex.storage.restore import install, read
        self._writable()
        target = validate_name(name or read(Path(path))["collection"])
        if (self.path / target / MANIFEST).exists() and not force:  # before copying anything
            raise AlreadyExists(f"collection {target!r} already exists: restore under another "
                                "name (--collection) or replace it (--force)")
        with self._lock:
            name, tmp, desc = install(Path(path), self.path, name, progress)
            try:
                folder = self.path / name
                if (folder / MANIFEST).exists():
                    if not force:
                        raise AlreadyExists(f"collection {name!r} already exists: restore "
                                            "under another name (--collection) or replace it "
                                            "(--force)")
                    self.drop_collection(name)
                elif folder.exists():  # a leftover without a manifest (crashed create)
                    fsutil.rmtree(folder, "restore")
                fsutil.rename(tmp, folder, "restore")
                fsutil.fsync_dir(self.path, "restore")
            except BaseException:
                fsutil.rmtree(tmp, "restore.undo")
                raise
        return {"collection": name, "documents": desc.get("documents"),
                "segments": desc.get("segments"), "files": len(desc["files"]),
                "bytes": sum(v["size"] for v in desc["files"].values())}

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Flush what is buffered (online mode), release the collections and the lock."""
        first = None
        with self._lock:
            for coll in self._collections.values():
                try:
                    coll.close()
                except Exception as e:  # noqa: BLE001 - close the others; the WAL keeps the data
                    log.error("closing collection %s failed: %s", coll.name, e)
                    first = first or e
            self._collections.clear()
            if self._dir_lock is not None:
                self._dir_lock.release()
                self._dir_lock = None
        if first is not None:
            raise first
