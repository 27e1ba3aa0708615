"""Reading, checking, restoring, listing and deleting snapshots (``storage.backup`` writes them).

``verify`` reads ``snapshot.json`` (its format, version and own checksum) and then every file
it lists (size and xxh3), and refuses anything else in the folder: a damaged snapshot is
``Corrupt`` naming the file before anything is written. ``install`` copies a verified
snapshot into a data directory as ``.<name>.creating-<uid>`` (the engine's leftover mark:
an interrupted restore is swept at the next writer's open), summing every file again as it
copies, and commits the manifest under the restored name with a new uid (a new incarnation
of the name); the engine renames it into place (``Engine.restore_snapshot``).
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path

from polyindex.config import validate_name
from polyindex.errors import Corrupt, InvalidArgument, NotFound
from polyindex.storage.backup import (FORMAT, FORMAT_VERSION, SNAPSHOT_FILE, TMP_MARK,
                                      copy_summed, files_of)
from polyindex.storage.fsutil import fsync_dir, mkdir, rename, rmtree
from polyindex.storage.integrity import check_sum_entry, is_plain_name, sum_file
from polyindex.storage.manifest import MANIFEST, commit_manifest, content_checksum, read_manifest

POINT = "restore"


def read(path: Path) -> dict:
    """``snapshot.json`` of the snapshot at ``path``, its structure and checksum checked."""
    path = Path(path)
    desc = path / SNAPSHOT_FILE
    if not path.is_dir():
        raise NotFound(f"snapshot {path} does not exist")
    try:
        data = json.loads(desc.read_bytes())
    except FileNotFoundError:
        raise Corrupt(f"{desc}: missing: {path} is not a complete snapshot (an interrupted "
                      "one, or not a snapshot)") from None
    except (OSError, ValueError) as e:
        raise Corrupt(f"{desc}: unreadable snapshot description: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise Corrupt(f"{desc}: not a polyindex snapshot description")
    fv = data.get("format_version")
    if not isinstance(fv, int) or fv < 1:
        raise Corrupt(f"{desc}: no valid format_version")
    if fv > FORMAT_VERSION:
        raise Corrupt(f"{desc}: snapshot format {fv} is newer than this polyindex understands "
                      f"({FORMAT_VERSION}); upgrade polyindex to restore it")
    if data.get("checksum") != content_checksum(data):
        raise Corrupt(f"{desc}: checksum mismatch (stored {data.get('checksum')!r}): the file "
                      "is damaged")
    files = data.get("files")
    if not isinstance(files, dict) or MANIFEST not in files:
        raise Corrupt(f"{desc}: lists no files (or no {MANIFEST})")
    for rel, value in files.items():
        parts = rel.split("/") if isinstance(rel, str) else []
        if not parts or not all(is_plain_name(p) for p in parts):
            raise Corrupt(f"{desc}: file {rel!r} is not a relative path of plain names")
        check_sum_entry(value, f"{desc}: file {rel}")
    return data


def verify(path: Path, progress=None) -> dict:
    """Check every file of the snapshot (Corrupt naming the first bad one); its description.
    ``progress(done, total)``: bytes checked so far."""
    path = Path(path)
    data = read(path)
    listed = set(data["files"]) | {SNAPSHOT_FILE}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_file() and rel not in listed:
            raise Corrupt(f"{p}: a file the snapshot description does not list")
    total, done = sum(v["size"] for v in data["files"].values()) or 1, 0
    for rel, expect in data["files"].items():
        _check(path / rel, expect)
        done += expect["size"]
        if progress is not None:
            progress(done, total)
    try:
        manifest = read_manifest(path)
    except Corrupt as e:
        raise Corrupt(f"{path / MANIFEST}: {e}") from e
    if manifest.version != data.get("manifest_version"):
        raise Corrupt(f"{path / MANIFEST}: version {manifest.version}, the snapshot description "
                      f"says {data.get('manifest_version')}")
    missing = sorted(set(files_of(manifest, path)) - set(data["files"]))
    if missing:
        raise Corrupt(f"{path / MANIFEST}: names {missing[0]}, which the snapshot description "
                      f"does not list ({len(missing)} such file(s))")
    return data


def _check(path: Path, expect: dict) -> None:
    """One file against the snapshot description's size and xxh3 (Corrupt naming it)."""
    try:
        got = sum_file(path)
    except FileNotFoundError:
        raise Corrupt(f"{path}: missing (the snapshot lists it)") from None
    except OSError as e:
        raise Corrupt(f"{path}: cannot read: {e}") from e
    if got != expect:
        raise Corrupt(f"{path}: damaged: {got['size']} bytes with xxh3 {got['xxh3']}, the "
                      f"snapshot lists {expect['size']} bytes with xxh3 {expect['xxh3']}")


def install(path: Path, data_dir: Path, name: str | None = None,
            progress=None) -> tuple[str, Path, dict]:
    """Verify the snapshot, then copy it into ``data_dir`` under a temporary dot-folder;
    returns (the collection's name, that folder, the snapshot's description). The caller
    renames the folder into place (or removes it). ``progress(phase, done, total)``: bytes
    of the phase ("checked", "copied") so far."""
    path = Path(path)
    desc = verify(path, None if progress is None else
                  lambda done, total: progress("checked", done, total))
    total, done = sum(v["size"] for v in desc["files"].values()) or 1, 0
    name = validate_name(name or desc["collection"])
    uid = uuid.uuid4().hex
    tmp = Path(data_dir) / f".{name}.creating-{uid}"
    try:
        for rel, expect in desc["files"].items():
            dst = tmp / rel
            mkdir(dst.parent, POINT, parents=True)
            got = copy_summed(path / rel, dst, POINT)
            if got != expect:  # changed since it was verified
                raise Corrupt(f"{path / rel}: changed while it was restored (xxh3 "
                              f"{got['xxh3']}, the snapshot says {expect['xxh3']})")
            done += got["size"]
            if progress is not None:
                progress("copied", done, total)
        for sub in ("segments", "tombstones", "artifacts"):
            mkdir(tmp / sub, POINT)
        manifest = read_manifest(tmp)
        manifest.config = replace(manifest.config, name=name, uid=uid)
        commit_manifest(tmp, manifest, f"{POINT}.manifest")  # fsyncs it and ``tmp``
        for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            fsync_dir(d, POINT)
        fsync_dir(tmp, POINT)
    except BaseException:
        rmtree(tmp, f"{POINT}.undo")
        raise
    return name, tmp, desc


def snapshot_path(root: Path, name: str) -> Path:
    """A snapshot under a server's snapshot root: a plain name, never a path."""
    if not is_plain_name(name):
        raise InvalidArgument(f"snapshot name {name!r}: use letters, digits, '_', '-' and '.' "
                              "(not starting with '.'), at most 128 characters")
    return Path(root) / name


def list_snapshots(root: Path) -> list[dict]:
    """The snapshots under ``root`` (their descriptions read, their files not checked); an
    unreadable one is listed with its problem."""
    root = Path(root)
    if not root.is_dir():
        raise NotFound(f"snapshot root {root} does not exist")
    out = []
    for p in sorted(root.iterdir()):
        if not p.is_dir() or p.name.startswith("."):
            continue
        try:
            d = read(p)
        except Corrupt as e:
            out.append({"name": p.name, "problem": str(e).removeprefix(f"{p}/")})
            continue
        out.append({"name": p.name, "collection": d["collection"], "documents": d.get("documents"),
                    "segments": d.get("segments"), "created_at": d.get("created_at"),
                    "bytes": sum(v.get("size", 0) for v in d["files"].values()
                                 if isinstance(v, dict))})
    return out


def delete(root: Path, name: str) -> None:
    """Remove the snapshot ``name`` under ``root`` (renamed away first: it is gone at once)."""
    path = snapshot_path(root, name)
    if not path.is_dir():
        raise NotFound(f"snapshot {name!r} not found under the snapshot root")
    gone = path.parent / f".{name}{TMP_MARK}deleting-{uuid.uuid4().hex[:12]}"
    rename(path, gone, f"{POINT}.delete")
    fsync_dir(path.parent, f"{POINT}.delete")
    shutil.rmtree(gone, ignore_errors=True)


def sweep(root: Path, older_than_s: float = 3600.0) -> list[str]:
    """Remove dot-folders of snapshots interrupted (a crash) over ``older_than_s`` ago."""
    removed = []
    for p in sorted(Path(root).iterdir()) if Path(root).is_dir() else ():
        if p.name.startswith(".") and TMP_MARK in p.name and p.is_dir() and \
                time.time() - p.stat().st_mtime > older_than_s:
            rmtree(p, f"{POINT}.sweep")
            removed.append(p.name)
    return removed
