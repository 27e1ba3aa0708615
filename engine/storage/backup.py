"""Snapshots of a collection (``Collection.snapshot``, ``polyindex snapshot create``): the files
one committed manifest names, copied (or hard-linked) into a folder that describes itself.

Layout of a snapshot folder (the collection's own layout, plus one file)::

    PATH/snapshot.json     format, format_version, the collection's name and config, the
                           manifest version and wal_through it holds, every file below with
                           its size and xxh3, and a checksum of its own content
    PATH/manifest.json     the pinned manifest (its segments, tombstones, artifacts)
    PATH/segments/...  PATH/tombstones/...  PATH/artifacts/...

It is written as ``.<name>.snapshot-<uid>`` beside PATH, every file and folder fsynced, then
renamed to PATH: a crash mid-way leaves a dot-folder that has no ``snapshot.json`` under the
final name and that ``restore`` refuses (``restore.verify``), never a half snapshot at PATH.

Which manifest, and what it holds, is the caller's (``Collection.snapshot``: the online
writer seals first, so the manifest holds every write acknowledged before the call). While
files are copied the caller holds that manifest's ``Snapshot``, which pins its segments and
tombstones against garbage collection (``storage.snapshot.pinned``); dropping it at the end
lets GC take them. Artifacts are not pinned (a metadata commit may write new ones): each
copied file is summed as it is copied and checked against the manifest, and a mismatch under
a manifest that moved meanwhile is retried with the new one. Failpoints: ``backup.*``.
"""
from __future__ import annotations

import errno
import json
import os
import time
import uuid
from pathlib import Path
from typing import Callable

import xxhash

from polyindex.errors import AlreadyExists, Corrupt, InvalidArgument, check_cancelled
from polyindex.storage import encoders
from polyindex.storage.failpoints import hit
from polyindex.storage.fsutil import fsync_dir, mkdir, rename, rmtree, write_file
from polyindex.storage.integrity import CHUNK, check_file
from polyindex.storage.manifest import MANIFEST, Manifest, content_checksum

SNAPSHOT_FILE = "snapshot.json"
FORMAT = "polyindex-snapshot"
FORMAT_VERSION = 1
TMP_MARK = ".snapshot-"  # ``.<name>.snapshot-<uid>``: a snapshot being written (or a crash's)
POINT = "backup"
ATTEMPTS = 5

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


def files_of(manifest: Manifest, folder: Path) -> dict[str, dict | None]:
    """Every file the manifest names, relative to the collection, with its recorded sum (None:
    a format-1 entry that carries none; summed when copied)."""
    out: dict[str, dict | None] = {}
    for s in manifest.segments:
        if s.files is not None:
            out.update({f"segments/{s.id}/{n}": v for n, v in s.files.items()})
        else:
            seg = folder / "segments" / s.id
            out.update({f"segments/{s.id}/{p.name}": None for p in sorted(seg.iterdir())
                        if p.is_file()})
        if s.tombstones:
            out[s.tombstones] = s.tombstones_sum
    for kind, names in manifest.artifacts.items():
        sums = manifest.artifact_sums.get(kind, {})
        out.update({f"artifacts/{kind}/{n}": sums.get(n) for n in names})
    out.update(encoders.files_of(manifest))  # an adapted collection's encoder(s)
    return out


def create(folder: Path, dest: Path, pin: Callable[[], "object"], *, link: bool = False,
           progress: Progress | None = None) -> dict:
    """Write a snapshot of the collection at ``folder`` to ``dest`` (which must not exist).

    ``pin()``: a ``storage.snapshot.Snapshot`` of the manifest to copy, held while copying.
    ``link``: hard-link segment and tombstone files (immutable) instead of copying them, where
    ``dest`` is on the same file system (falls back to a copy); a link shares the source's
    disk blocks, so it protects against a dropped collection, not against a damaged disk.
    Returns a summary: path, documents, files, bytes, manifest version, seconds."""
    start = time.perf_counter()
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise AlreadyExists(f"snapshot {dest} already exists (delete it or choose another path)")
    if not dest.name or dest.name.startswith("."):
        raise InvalidArgument(f"snapshot path {dest}: the last part must be a name not "
                              "starting with '.'")
    mkdir(dest.parent, POINT, parents=True)
    tmp = dest.parent / f".{dest.name}{TMP_MARK}{uuid.uuid4().hex[:12]}"
    try:
        for attempt in range(ATTEMPTS):
            snap = pin()  # held until this attempt is done: GC leaves its files
            manifest = snap.manifest
            try:
                files = _copy_all(folder, manifest, tmp, link, progress)
                break
            except Corrupt:
                # an artifact replaced by a metadata commit since ``pin``: copy the newer one
                rmtree(tmp, POINT)
                if attempt == ATTEMPTS - 1 or pin().manifest.version == manifest.version:
                    raise
            finally:
                del snap
        body = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "collection": manifest.config.name, "config": manifest.config.to_json(),
                "manifest_version": manifest.version, "wal_through": manifest.wal_through,
                "documents": manifest.live_rows(), "segments": len(manifest.segments),
                "created_at": time.time(), "files": files}
        body["checksum"] = content_checksum(body)
        write_file(tmp / SNAPSHOT_FILE, json.dumps(body, indent=1, sort_keys=True).encode(),
                   POINT)
        _fsync_dirs(tmp)
        try:
            rename(tmp, dest, POINT)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another snapshot got there first
                raise AlreadyExists(f"snapshot {dest} already exists") from None
            raise
        fsync_dir(dest.parent, POINT)
    except BaseException:
        rmtree(tmp, f"{POINT}.undo")
        raise
    return {"path": str(dest), "collection": manifest.config.name,
            "documents": body["documents"], "segments": body["segments"],
            "files": len(files), "bytes": sum(v["size"] for v in files.values()),
            "manifest_version": manifest.version, "seconds": time.perf_counter() - start}


def _copy_all(folder: Path, manifest: Manifest, tmp: Path, link: bool,
              progress: Progress | None) -> dict[str, dict]:
    wanted = files_of(manifest, folder)
    total = sum(v["size"] for v in wanted.values() if v) or 1
    done = 0
    mkdir(tmp, POINT)
    out: dict[str, dict] = {}
    for rel, expect in wanted.items():
        check_cancelled("the snapshot")  # a server's call that is over: its folder goes
        src, dst = folder / rel, tmp / rel
        mkdir(dst.parent, POINT, parents=True)
        linkable = link and expect is not None and not rel.startswith("artifacts/")
        if linkable and _link(src, dst):
            check_file(dst, expect)  # read once: a link is only as good as the source
            out[rel] = dict(expect)
        else:
            got = copy_summed(src, dst, POINT)
            if expect is not None and got != expect:
                raise Corrupt(f"{src}: checksum mismatch while copying it into a snapshot "
                              f"(xxh3 {got['xxh3']}, size {got['size']}; the manifest says "
                              f"{expect['xxh3']}, {expect['size']}): the file is damaged")
            out[rel] = got
        done += out[rel]["size"]
        if progress is not None:
            progress(done, total)
    data = json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode()
    write_file(tmp / MANIFEST, data, POINT)
    out[MANIFEST] = {"size": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}
    return out


def _link(src: Path, dst: Path) -> bool:
    try:
        os.link(src, dst)
        return True
    except FileNotFoundError:
        raise Corrupt(f"{src}: missing (the manifest names it)") from None
    except OSError:  # another file system, or links not allowed: copy instead
        return False


def copy_summed(src: Path, dst: Path, point: str) -> dict:
    """Copy ``src`` to a new ``dst`` (fsynced), returning the size and xxh3 of what was read."""
    h = xxhash.xxh3_64()
    size = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    try:
        fin = open(src, "rb", buffering=0)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise Corrupt(f"{src}: missing (the manifest names it)") from None
    with fin, open(dst, "xb") as fout:
        hit(f"{point}.write", dst)
        while n := fin.readinto(buf):
            h.update(view[:n])
            fout.write(view[:n])
            size += n
        fout.flush()
        hit(f"{point}.fsync", dst)
        os.fsync(fout.fileno())
    return {"size": size, "xxh3": h.hexdigest()}


def _fsync_dirs(root: Path) -> None:
    """Every folder under ``root``, deepest first, then ``root`` (files were fsynced as written)."""
    dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for d in dirs:
        fsync_dir(d, POINT)
    fsync_dir(root, POINT)

