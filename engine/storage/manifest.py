"""The manifest: the single source of truth of a collection, committed atomically.

One JSON file, ``manifest.json``, replaced by write-temp + fsync + rename. It lists the live
segments with their tombstone files and per-index build info, the collection config, the
collection-level trained artifacts, and the state of the last bulk ingest (for resume).

Format 2 adds integrity: every file the manifest names has its size and xxh3_64 recorded
(``files`` of a segment, ``tombstones_sum``, ``artifact_sums``), and the manifest carries a
``checksum`` of its own content, so a damaged byte that still parses as JSON is caught.
Entries carried over from format 1 have no sums; their Arrow files are validated instead.
Every path a manifest names is checked here to stay inside the collection.
"""
from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from polyindex.config import CollectionConfig
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index.registry import from_factory
from polyindex.storage import encoders
from polyindex.storage.failpoints import hit
from polyindex.storage.fsutil import write_json_atomic
from polyindex.storage.integrity import check_artifacts, check_sum_entry, is_plain_name

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SEGMENT_ID = re.compile(r"^seg-[0-9]{6,}$")
TOMBSTONES = re.compile(r"^tombstones/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})\.arrow$")


@dataclass
class SegmentEntry:
    id: str
    n_rows: int
    indexes: dict[str, dict]  # kind -> build info returned by IndexKind.build
    tombstones: str | None = None  # file (relative to the collection) of deleted row ids
    n_deleted: int = 0
    files: dict[str, dict] | None = None  # file name in the segment folder -> size, xxh3
    tombstones_sum: dict | None = None
    # Read from a manifest without sums (format 1): validate the Arrow files instead. False
    # for entries built in this process (online buffer segments), which are checked by nobody.
    legacy: bool = field(default=False, compare=False)

    def to_json(self) -> dict:
        out = dict(id=self.id, n_rows=self.n_rows, indexes=self.indexes,
                   tombstones=self.tombstones, n_deleted=self.n_deleted)
        if self.files is not None:
            out["files"] = self.files
        if self.tombstones_sum is not None:
            out["tombstones_sum"] = self.tombstones_sum
        return out


@dataclass
class Manifest:
    config: CollectionConfig
    version: int = 0
    segments: list[SegmentEntry] = field(default_factory=list)
    artifacts: dict[str, list[str]] = field(default_factory=dict)  # kind -> files under artifacts/
    artifact_sums: dict[str, dict[str, dict]] = field(default_factory=dict)  # kind -> file -> sum
    ingest: dict | None = None
    next_segment: int = 0
    format_version: int = FORMAT_VERSION
    wal_through: int = 0  # the highest WAL sequence number whose write the segments hold
    # which encoder made the stored vectors (``storage.encoders``; None: never adapted)
    encoder: dict | None = None

    def to_json(self) -> dict:
        data = {
            "format_version": self.format_version, "version": self.version,
            "collection": self.config.to_json(),
            "segments": [s.to_json() for s in self.segments],
            "artifacts": self.artifacts, "artifact_sums": self.artifact_sums,
            "ingest": self.ingest, "next_segment": self.next_segment,
            "wal_through": self.wal_through,
            "committed_at": time.time(),
        }
        if self.encoder is not None:  # absent until an adapt: older readers see no change
            data["encoder"] = self.encoder
        data["checksum"] = content_checksum(data)
        return data

    def copy(self) -> "Manifest":
        return copy.deepcopy(self)

    def live_rows(self) -> int:
        return sum(s.n_rows - s.n_deleted for s in self.segments)


def content_checksum(data: dict) -> str:
    """xxh3_64 of the manifest's content (every key but ``checksum``) in a canonical form."""
    body = {k: v for k, v in data.items() if k != "checksum"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return xxhash.xxh3_64_hexdigest(canon.encode())


def read_manifest(folder: Path, point: str = "manifest") -> Manifest:
    """Parse and check ``folder/manifest.json`` (its checksum, structure and every path it
    names); the files it names are not read. ``FileNotFoundError`` when there is none.
    ``point``: the failpoint prefix of the read (``<point>.read``)."""
    path = folder / MANIFEST
    try:
        hit(f"{point}.read", path)
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise Corrupt(f"{path}: unreadable manifest: {e}") from e
    if not isinstance(data, dict):
        raise Corrupt(f"{path}: manifest is not a JSON object (got {type(data).__name__})")
    fv = data.get("format_version")
    if not isinstance(fv, int) or isinstance(fv, bool) or fv < 1:
        raise Corrupt(f"{path}: manifest has no valid format_version")
    if fv > FORMAT_VERSION:
        raise Corrupt(f"{path}: format_version {fv} is newer than this polyindex understands "
                      f"({FORMAT_VERSION}); upgrade polyindex to open it")
    if fv >= 2:
        stored = data.get("checksum")
        if stored != content_checksum(data):
            raise Corrupt(f"{path}: manifest checksum mismatch (stored {stored!r}): the file "
                          "is damaged")
    if not isinstance(data.get("version"), int):
        raise Corrupt(f"{path}: manifest has no integer version")
    try:
        manifest = Manifest(
            config=CollectionConfig.from_json(data["collection"]), version=data["version"],
            segments=[_segment(s, fv) for s in data["segments"]],
            artifacts=data.get("artifacts", {}), artifact_sums=data.get("artifact_sums", {}),
            ingest=data.get("ingest"), next_segment=data.get("next_segment", 0),
            format_version=fv, wal_through=data.get("wal_through", 0),
            encoder=data.get("encoder"))
        _check(manifest)
    except Corrupt as e:
        raise Corrupt(f"{path}: {e}") from e
    except (KeyError, TypeError, AttributeError, ValueError, InvalidArgument) as e:
        raise Corrupt(f"{path}: malformed manifest ({type(e).__name__}: {e})") from e
    return manifest


def load_manifest(folder: Path, point: str = "manifest") -> Manifest:
    """``read_manifest``, then the collection-level artifacts it names are verified (once
    per process per file): every reader and writer loads them right after the manifest."""
    manifest = read_manifest(folder, point)
    check_artifacts(folder, manifest)
    try:
        encoders.check_files(folder, manifest)
    except Corrupt as e:
        raise Corrupt(f"encoder of {folder.name!r}: {e}") from e
    return manifest


def _segment(s: dict, fv: int) -> SegmentEntry:
    if not isinstance(s, dict):
        raise TypeError(f"segment entry is a {type(s).__name__}, not an object")
    known = {k: s[k] for k in SegmentEntry.__dataclass_fields__ if k in s and k != "legacy"}
    return SegmentEntry(**known, legacy="files" not in s)


def _is_int(v: object, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _check(m: Manifest) -> None:
    """Structure and paths: everything a reader will join onto the collection folder."""
    for factory in m.config.indexes:
        try:
            from_factory(factory)
        except InvalidArgument as e:  # stored, so damaged: not the caller's argument
            raise Corrupt(f"stored index factory string {factory!r} does not parse: {e}") from e
    if not _is_int(m.wal_through):
        raise Corrupt(f"wal_through {m.wal_through!r} is not a non-negative integer")
    seen: set[str] = set()
    top = -1
    for s in m.segments:
        if not isinstance(s.id, str) or not SEGMENT_ID.match(s.id):
            raise Corrupt(f"segment id {s.id!r} is not of the form seg-NNNNNN")
        if s.id in seen:
            raise Corrupt(f"segment {s.id} is listed twice")
        seen.add(s.id)
        top = max(top, int(s.id[4:]))
        if not _is_int(s.n_rows) or not _is_int(s.n_deleted) or s.n_deleted > s.n_rows:
            raise Corrupt(f"segment {s.id}: bad row counts n_rows={s.n_rows!r} "
                          f"n_deleted={s.n_deleted!r}")
        if not isinstance(s.indexes, dict):
            raise Corrupt(f"segment {s.id}: indexes is not an object")
        if s.tombstones is not None and (not isinstance(s.tombstones, str)
                                         or not TOMBSTONES.match(s.tombstones)
                                         or ".." in s.tombstones):
            raise Corrupt(f"segment {s.id}: tombstone path {s.tombstones!r} is not "
                          "tombstones/<name>.arrow")
        if s.files is not None:
            if not isinstance(s.files, dict):
                raise Corrupt(f"segment {s.id}: files is not an object")
            for name, value in s.files.items():
                if not is_plain_name(name):
                    raise Corrupt(f"segment {s.id}: file name {name!r} is not a plain name")
                check_sum_entry(value, f"segment {s.id} file {name}")
        if s.tombstones_sum is not None:
            if s.tombstones is None:
                raise Corrupt(f"segment {s.id}: a tombstone checksum without a tombstone file")
            check_sum_entry(s.tombstones_sum, f"segment {s.id} tombstones")
    if _is_int(m.next_segment) and m.next_segment <= top and m.format_version == 1:
        m.next_segment = top + 1  # format 1 did not check it; never reuse a segment id
    if not _is_int(m.next_segment) or m.next_segment <= top:
        raise Corrupt(f"next_segment {m.next_segment!r} does not follow the last segment")
    encoders.check_record(m.encoder)
    if not isinstance(m.artifacts, dict) or not isinstance(m.artifact_sums, dict):
        raise Corrupt("artifacts is not an object")
    for kind, files in m.artifacts.items():
        if not is_plain_name(kind) or not isinstance(files, list) \
                or not all(is_plain_name(f) for f in files):
            raise Corrupt(f"artifact {kind!r}: names must be plain file names, got {files!r}")
    for kind, sums in m.artifact_sums.items():
        if kind not in m.artifacts or not isinstance(sums, dict) \
                or not set(sums) <= set(m.artifacts[kind]):
            raise Corrupt(f"artifact sums of {kind!r} name files the manifest does not list")
        for name, value in sums.items():
            check_sum_entry(value, f"artifact {kind}/{name}")


def commit_manifest(folder: Path, manifest: Manifest, point: str = "commit.manifest") -> Manifest:
    """Write ``manifest`` as the next version; atomic: a crash leaves the old or the new one.
    Always written in the current format (entries from format 1 keep no sums)."""
    manifest.version += 1
    manifest.format_version = FORMAT_VERSION
    write_json_atomic(folder / MANIFEST, manifest.to_json(), point)
    return manifest
