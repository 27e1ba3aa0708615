"""The manifest: the single source of truth of a collection, committed atomically.

One JSON file, ``manifest.json``, replaced by write-temp + fsync + rename. It lists the live
segments with their tombstone files and per-index build info, the collection config, the
collection-level trained artifacts, and the state of the last bulk ingest (for resume).
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from polyindex.config import CollectionConfig
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.storage.fsutil import write_json_atomic

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class SegmentEntry:
    id: str
    n_rows: int
    indexes: dict[str, dict]  # kind -> build info returned by IndexKind.build
    tombstones: str | None = None  # file (relative to the collection) of deleted row ids
    n_deleted: int = 0

    def to_json(self) -> dict:
        return dict(id=self.id, n_rows=self.n_rows, indexes=self.indexes,
                    tombstones=self.tombstones, n_deleted=self.n_deleted)


@dataclass
class Manifest:
    config: CollectionConfig
    version: int = 0
    segments: list[SegmentEntry] = field(default_factory=list)
    artifacts: dict[str, list[str]] = field(default_factory=dict)  # kind -> files under artifacts/
    ingest: dict | None = None
    next_segment: int = 0
    format_version: int = FORMAT_VERSION
    wal_through: int = 0  # the highest WAL sequence number whose write the segments hold

    def to_json(self) -> dict:
        return {
            "format_version": self.format_version, "version": self.version,
            "collection": self.config.to_json(),
            "segments": [s.to_json() for s in self.segments],
            "artifacts": self.artifacts, "ingest": self.ingest,
            "next_segment": self.next_segment, "wal_through": self.wal_through,
            "committed_at": time.time(),
        }

    def copy(self) -> "Manifest":
        return copy.deepcopy(self)

    def live_rows(self) -> int:
        return sum(s.n_rows - s.n_deleted for s in self.segments)


def load_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise Corrupt(f"{path}: unreadable manifest: {e}") from e
    if not isinstance(data, dict):
        raise Corrupt(f"{path}: manifest is not a JSON object (got {type(data).__name__})")
    fv = data.get("format_version")
    if not isinstance(fv, int):
        raise Corrupt(f"{path}: manifest has no integer format_version")
    if fv > FORMAT_VERSION:
        raise Corrupt(f"{path}: format_version {fv} is newer than this polyindex understands "
                      f"({FORMAT_VERSION}); upgrade polyindex to open it")
    if not isinstance(data.get("version"), int):
        raise Corrupt(f"{path}: manifest has no integer version")
    try:
        return Manifest(
            config=CollectionConfig.from_json(data["collection"]), version=data["version"],
            segments=[SegmentEntry(**{k: s[k] for k in SegmentEntry.__dataclass_fields__ if k in s})
                      for s in data["segments"]],
            artifacts=data.get("artifacts", {}), ingest=data.get("ingest"),
            next_segment=data.get("next_segment", 0), format_version=fv,
            wal_through=data.get("wal_through", 0))
    except (KeyError, TypeError, AttributeError, InvalidArgument) as e:
        raise Corrupt(f"{path}: malformed manifest ({type(e).__name__}: {e})") from e


def commit_manifest(folder: Path, manifest: Manifest) -> Manifest:
    """Write ``manifest`` as the next version; atomic: a crash leaves the old or the new one."""
    manifest.version += 1
    write_json_atomic(folder / MANIFEST, manifest.to_json(), "commit.manifest")
    return manifest
