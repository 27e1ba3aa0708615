"""The embedded engine: a data directory holding named collections."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Sequence

from polyindex.collection import Collection
from polyindex.config import DEFAULT_INDEXES, DEFAULT_MODEL, CollectionConfig, validate_name
from polyindex.cuda.device import check_device
from polyindex.errors import AlreadyExists, NotFound
from polyindex.index.protocol import from_factory
from polyindex.storage.fsutil import fsync_dir
from polyindex.storage.manifest import MANIFEST, Manifest, commit_manifest


class Engine:
    def __init__(self, path: str | Path, device: str = "cpu", create: bool = True,
                 online: bool = False):
        """``online=True`` is the serving mode: writes go through a write-ahead log and an
        in-memory buffer sealed into segments in the background (see ``polyindex.online.wal``)."""
        self.path = Path(path)
        self.online = online
        self.device = check_device(device)
        if not self.path.exists():
            if not create:
                raise NotFound(f"data directory {self.path} does not exist")
            self.path.mkdir(parents=True)
        self._collections: dict[str, Collection] = {}
        self._lock = threading.Lock()

    def list_collections(self) -> list[str]:
        # Dot-folders are never collections (names cannot start with '.'): they are the
        # leftovers of an interrupted create (.NAME.creating) or drop (.NAME.dropping).
        return sorted(p.name for p in self.path.iterdir()
                      if not p.name.startswith(".") and (p / MANIFEST).exists())

    def create_collection(self, name: str, indexes: Sequence[str] = DEFAULT_INDEXES, *,
                          model: str = DEFAULT_MODEL, dtype: str = "bfloat16",
                          segment_size: int = 50_000, fields: dict[str, str] | None = None,
                          profiles: dict[str, dict] | None = None,
                          exist_ok: bool = False) -> Collection:
        validate_name(name)
        folder = self.path / name
        if (folder / MANIFEST).exists():
            if exist_ok:
                return self.collection(name)
            raise AlreadyExists(f"collection {name!r} already exists in {self.path}")
        kinds = [from_factory(f) for f in indexes]  # validates factory strings up front
        config = CollectionConfig(name=name, indexes=[k.describe() for k in kinds], model=model,
                                  dtype=dtype, segment_size=segment_size, fields=dict(fields or {}),
                                  profiles=dict(profiles or {}))
        if profiles:
            from polyindex.query.profiles import Profile
            for pname, p in profiles.items():
                validate_name(pname, "profile")
                Profile.from_json(pname, p, {k.kind for k in kinds})
        # Build the collection in a temporary folder and rename it in: all or nothing.
        tmp = self.path / f".{name}.creating"
        shutil.rmtree(tmp, ignore_errors=True)
        for sub in ("segments", "tombstones", "artifacts"):
            (tmp / sub).mkdir(parents=True)
        commit_manifest(tmp, Manifest(config=config))
        if folder.exists():  # a leftover without a manifest (crashed create): replace it
            shutil.rmtree(folder)
        tmp.rename(folder)
        fsync_dir(self.path)
        return self.collection(name)

    def collection(self, name: str) -> Collection:
        validate_name(name)
        with self._lock:
            if name not in self._collections:
                folder = self.path / name
                if not (folder / MANIFEST).exists():
                    raise NotFound(f"collection {name!r} not found in {self.path} "
                                   f"(have: {', '.join(self.list_collections()) or 'none'})")
                self._collections[name] = Collection(folder, self.device, online=self.online)
            return self._collections[name]

    def drop_collection(self, name: str) -> None:
        coll = self.collection(name)
        with self._lock:
            self._collections.pop(name, None)
        tomb = self.path / f".{name}.dropping"
        coll.folder.rename(tomb)  # atomic: the collection disappears at once
        shutil.rmtree(tomb, ignore_errors=True)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Flush what is buffered (online mode) and release the collections."""
        with self._lock:
            for coll in self._collections.values():
                coll.close()
            self._collections.clear()
