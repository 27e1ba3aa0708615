"""Garbage collection: files no committed manifest names and no live snapshot pins.

Commits stop naming files (a delete writes a new tombstone version, a merge replaces its
source segments); the writer lists those as candidates and they are removed after the
commit, unless a snapshot alive in this process still reads them (``snapshot.pinned``);
pinned ones are retried later. A full sweep (``sweep``: at a writer's open and on
``compact``) also finds what a crash left: merged-away segments whose removal did not
happen, ``.merge-*`` folders of an interrupted merge, tombstone files of a failed commit.
A file the manifest names is never removed. Readers in other processes that lose a race
with a removal re-read the manifest (``storage.table.Table.sealed_snapshot``). Failpoint
``gc.unlink``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

from polyindex.storage.fsutil import fsync_dir, rmtree, unlink
from polyindex.storage.manifest import Manifest
from polyindex.storage.merge import MERGE_PREFIX, building
from polyindex.storage.snapshot import pinned

log = logging.getLogger("polyindex.storage")


def named(manifest: Manifest) -> set[str]:
    """What a manifest names, relative to the collection (segment folders, tombstones)."""
    out = {f"segments/{s.id}" for s in manifest.segments}
    out.update(s.tombstones for s in manifest.segments if s.tombstones)
    return out


def sweep(folder: Path, manifest: Manifest) -> list[str]:
    """Every leftover under ``segments/`` and ``tombstones/`` that ``manifest`` does not name
    (not yet checked against pins: ``remove`` does that)."""
    keep = named(manifest)
    active = building()
    out = []
    seg_dir = folder / "segments"
    for entry in sorted(seg_dir.iterdir()) if seg_dir.is_dir() else ():
        rel = f"segments/{entry.name}"
        if entry.name.startswith("seg-") and rel not in keep:
            out.append(rel)
        elif entry.name.startswith(MERGE_PREFIX) and entry not in active:
            out.append(rel)
    tomb_dir = folder / "tombstones"
    for entry in sorted(tomb_dir.iterdir()) if tomb_dir.is_dir() else ():
        rel = f"tombstones/{entry.name}"
        if rel not in keep:
            out.append(rel)
    return out


def remove(folder: Path, candidates: Iterable[str], manifest: Manifest) -> tuple[list[str], list[str]]:
    """Remove the candidates that ``manifest`` (the last committed one) does not name and no
    live snapshot pins; returns (removed, still pinned). Each removal's folder is fsynced."""
    keep = named(manifest)
    pins = pinned(folder)
    removed, later, touched = [], [], set()
    for rel in dict.fromkeys(candidates):
        if rel in keep:
            continue
        if rel in pins:
            later.append(rel)
            continue
        path = folder / rel
        try:
            if path.is_dir():
                rmtree(path, "gc")
            else:
                unlink(path, "gc")
        except OSError as e:  # left for the next sweep; nothing depends on it
            log.warning("%s: could not remove %s: %s", folder.name, rel, e)
            later.append(rel)
            continue
        removed.append(rel)
        touched.add(path.parent)
    for parent in touched:
        try:
            fsync_dir(parent, "gc")
        except OSError as e:
            log.warning("%s: fsync of %s after removals failed: %s", folder.name, parent, e)
    return removed, later


def size_of(path: Path) -> int:
    """Bytes under ``path``; what a concurrent collection (a background merge's) removes
    while it is counted counts 0."""
    if path.is_dir():
        try:
            return sum(map(size_of, list(path.iterdir())))
        except FileNotFoundError:
            return 0
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def disk_usage(folder: Path, manifest: Manifest) -> dict:
    """Bytes the manifest's files take (from its sums: no scan), bytes of garbage on disk,
    and an estimate of what compaction would reclaim (deleted rows' share of their
    segments, plus the garbage)."""
    live = deleted = 0
    for s in manifest.segments:
        size = sum(f.get("size", 0) for f in (s.files or {}).values())
        if s.files is None:
            size = size_of(folder / "segments" / s.id)
        if s.tombstones_sum:
            size += s.tombstones_sum.get("size", 0)
        live += size
        deleted += size * s.n_deleted // max(1, s.n_rows)
    garbage = sum(size_of(folder / rel) for rel in sweep(folder, manifest))
    return {"bytes_on_disk": live + garbage, "bytes_garbage": garbage,
            "bytes_reclaimable": garbage + deleted}
