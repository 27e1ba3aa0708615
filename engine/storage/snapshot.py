"""A snapshot: one manifest version's segments, opened read-only and shared between queries.

Segments are immutable, so their opened files (documents, each kind's index) are cached by
segment id in the collection and shared by every snapshot that lists them; a commit only opens
what is new. A reader keeps using its snapshot until it asks for a fresh one.
"""
from __future__ import annotations

import threading
import weakref
from pathlib import Path

import numpy as np

import pyarrow as pa

from polyindex.errors import Corrupt
from polyindex.index.protocol import IndexKind, SegmentIndex
from polyindex.storage import idindex
from polyindex.storage.failpoints import hit
from polyindex.storage.integrity import check_folder, validate_arrow
from polyindex.storage.manifest import Manifest
from polyindex.storage.segment import DOCS_FILE, Segment, load_tombstones


class OpenedSegment:
    """A segment's documents and every kind's index over them. A manifest entry's files are
    checked (sizes and sums; format 1: Arrow validation) before any kind reads them."""

    def __init__(self, folder: Path, entry, kinds: dict[str, IndexKind]):
        if entry.files is not None:
            check_folder(folder, entry.files, f"segment {entry.id}")
        self.docs = Segment(folder, entry.id, entry.n_rows, sums=entry.files,
                            validate=entry.legacy)
        # Mapped now, not at first use: a writer elsewhere may remove a merged-away
        # segment's files once this process holds them open (a mapping outlives an unlink).
        self.docs.id_entries()
        if entry.legacy:
            for path in sorted(folder.glob("*.arrow")):
                if path.name != DOCS_FILE:
                    validate_arrow(path)
        self.indexes: dict[str, SegmentIndex] = {}
        for name, kind in kinds.items():
            info = entry.indexes.get(name)
            if info is None:
                raise Corrupt(f"segment {entry.id} has no {name!r} index (manifest lists "
                              f"{sorted(entry.indexes)})")
            try:
                self.indexes[name] = kind.open(folder, info, self.docs)
            except (OSError, pa.ArrowException) as e:
                raise Corrupt(f"segment {entry.id}: cannot open its {name} index in {folder}: "
                              f"{e}") from e
            except (ValueError, RuntimeError, IndexError, KeyError, TypeError) as e:
                if not entry.legacy:
                    raise  # checked files that do not open: a bug, not damage
                raise Corrupt(f"segment {entry.id}: its {name} index in {folder} does not "
                              f"open (format-1 files carry no checksum): {e}") from e


_live_snapshots: "weakref.WeakSet[Snapshot]" = weakref.WeakSet()
_live_lock = threading.Lock()


def pinned(collection: Path) -> set[str]:
    """Files (relative to the collection folder) that a snapshot alive in this process may
    still read: its segments' folders and its tombstone files. Garbage collection leaves them."""
    segments = collection / "segments"
    with _live_lock:
        snaps = list(_live_snapshots)
    out: set[str] = set()
    for snap in snaps:
        mine = [s for s in snap.segments if s.docs.folder.parent == segments]
        if mine:
            out.update(f"segments/{s.docs.folder.name}" for s in mine)
            out.update(e.tombstones for e in snap.manifest.segments if e.tombstones)
    return out


class Snapshot:
    """Segments with their live masks; queries never see anything else.

    ``from_manifest`` gives a sealed snapshot; online collections ``compose`` one with the
    in-memory buffer's segments and the rows those writes hide.
    """

    def __init__(self, manifest: Manifest, kinds: dict[str, IndexKind],
                 segments: list[OpenedSegment], live: list[np.ndarray | None],
                 stacks: dict | None = None):
        self.manifest = manifest
        self.version = manifest.version
        self.kinds = kinds
        self.segments = segments
        self.live = live
        # an online buffer's consecutive Flat dense segments as one stack, by the ordinal of
        # the first: {first: dense_stack.StackView} (segments covered, matrix, keys, graph)
        self.stacks = stacks or {}
        sizes = [s.docs.n_rows for s in self.segments]
        self.bases = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.cache: dict[str, dict] = {name: {} for name in kinds}
        self._count: int | None = None
        with _live_lock:  # pins its files against garbage collection while it lives
            _live_snapshots.add(self)

    @classmethod
    def from_manifest(cls, folder: Path, manifest: Manifest, kinds: dict[str, IndexKind],
                      opened: dict[str, OpenedSegment],
                      tombstone_cache: dict[str, np.ndarray],
                      point: str = "snapshot") -> "Snapshot":
        """``point``: the failpoint prefix of opening a segment (``<point>.segment.open``)
        and reading a tombstone file (``<point>.tombstones.read``)."""
        segments, live = [], []
        for entry in manifest.segments:
            if entry.id not in opened:
                hit(f"{point}.segment.open", folder / "segments" / entry.id)
                opened[entry.id] = OpenedSegment(folder / "segments" / entry.id, entry, kinds)
            segments.append(opened[entry.id])
            if entry.tombstones:
                if entry.tombstones not in tombstone_cache:
                    hit(f"{point}.tombstones.read", folder / entry.tombstones)
                    tombstone_cache[entry.tombstones] = load_tombstones(folder, entry)
                live.append(tombstone_cache[entry.tombstones])
            else:
                live.append(None)
        return cls(manifest, kinds, segments, live)

    def count(self) -> int:
        if self._count is None:
            self._count = sum(s.docs.n_rows if m is None else int(m.sum())
                              for s, m in zip(self.segments, self.live))
        return self._count

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global keys (segment base + row) -> (segment ordinal, row)."""
        seg = np.searchsorted(self.bases, keys, side="right") - 1
        return seg, keys - self.bases[seg]

    def by_segment(self, keys: np.ndarray):
        """(segment ordinal, positions in ``keys``, rows) per segment the keys touch."""
        seg, rows = self.locate(keys)
        for s in np.unique(seg).tolist():
            at = np.flatnonzero(seg == s)
            yield s, at, rows[at]

    def ids_of(self, keys: np.ndarray) -> list[str]:
        if len(self.segments) == 1:
            return self.segments[0].docs.ids_at(keys)
        out: list = [None] * len(keys)
        for s, at, rows in self.by_segment(keys):  # one read per segment the keys touch
            for p, doc_id in zip(at.tolist(), self.segments[s].docs.ids_at(rows)):
                out[p] = doc_id
        return out

    def id_ranks(self, keys: np.ndarray) -> np.ndarray | None:
        """Where every key is of one segment, their ids' places in that segment's id order
        (``Segment.id_ranks``: integers that sort as the ids do); else None."""
        if len(self.segments) == 1:
            return self.segments[0].docs.id_ranks()[keys]
        seg, rows = self.locate(keys)
        if not len(seg) or (seg != seg[0]).any():
            return None
        return self.segments[int(seg[0])].docs.id_ranks()[rows]

    def id_array(self, keys: np.ndarray) -> pa.Array:
        """The ids of ``keys`` as an Arrow string array (one ``take`` per segment the keys
        touch, no Python strings): what sorts many ids at once, in C++."""
        keys = np.asarray(keys, np.int64)
        if len(self.segments) == 1:
            return self.segments[0].docs.id_take(keys)
        parts, where = [], []
        for s, at, rows in self.by_segment(keys):
            parts.append(self.segments[s].docs.id_take(rows))
            where.append(at)
        back = np.empty(len(keys), np.int64)
        back[np.concatenate(where)] = np.arange(len(keys))
        return pa.concat_arrays(parts).take(pa.array(back))

    def find(self, ids: list[str]) -> list[tuple[int, int] | None]:
        """(segment ordinal, row) of each live id, or None; later segments win."""
        out: list[tuple[int, int] | None] = [None] * len(ids)
        hashes = idindex.hash_ids(ids)
        for s in range(len(self.segments) - 1, -1, -1):
            rows = self.segments[s].docs.rows_of(ids, hashes)
            live = self.live[s]
            for i, r in enumerate(rows.tolist()):
                if out[i] is None and r >= 0 and (live is None or live[r]):
                    out[i] = (s, r)
        return out
