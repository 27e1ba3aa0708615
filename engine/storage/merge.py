"""Merging segments: the live rows of several segments rewritten as one, swapped in by one
manifest commit (the Lucene/tantivy way).

A merge has two halves. ``build_merge`` reads a snapshot (no lock held: queries and writes
go on) and writes the merged segment into ``segments/.merge-<pid>-<n>.tmp``: the live rows'
documents copied as Arrow, vectors copied (never re-encoded), and every kind's index built
over them, or merged from the sources' own data where the kind declares ``Merges``
(multivector copies its token codes, lexical re-numbers its forward index, an IVF dense
field copies its codes). ``commit_merge`` runs under the writer: rows that died
since the snapshot (deleted, or replaced by a newer upsert) are tombstoned in the merged
segment, the folder is renamed to the next ``seg-N`` and one manifest version replaces the
sources with it. The sources' files are then garbage (``polyindex.storage.gc``).

Crash-safety: until the manifest rename nothing a reader sees changed; a ``.merge-*`` folder
is removed by garbage collection (never while this process builds it), an uncommitted
``seg-N`` by the next writer. Failpoints: ``merge.segment`` (fsync of the built files and
folder, the rename, fsync of ``segments/``), ``merge.tombstones``, ``merge.manifest``.
"""
from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from polyindex.index.protocol import BuildBatch, Merges, implements
from polyindex.storage import build_worker, failpoints, idindex
from polyindex.storage.fsutil import fsync_dir, fsync_tree, rename, write_file
from polyindex.storage.integrity import remember, sum_bytes, sum_file
from polyindex.storage.manifest import SegmentEntry, commit_manifest
from polyindex.storage.segment import (DOCS_FILE, PRUNED_COLUMN, QUALITY_COLUMN, load_tombstones,
                                       tombstone_bytes)
from polyindex.storage.snapshot import OpenedSegment, Snapshot
from polyindex.storage.writer import stored_columns

MERGE_PREFIX = ".merge-"
_names = itertools.count()
_building: set[Path] = set()  # merge folders being built in this process: GC leaves them
_building_lock = threading.Lock()


class Cancelled(Exception):
    """The merge was asked to stop (the collection is closing) or its sources changed under
    it (another merge, a drop); nothing was committed."""


@dataclass
class BuiltMerge:
    sources: list[str]                  # segment ids merged, in manifest order
    live: list[np.ndarray | None]       # each source's live mask when the merge read it
    folder: Path | None                 # the built segment (None: no live rows at all)
    n_rows: int = 0
    rows_in: int = 0                    # the sources' rows (live and deleted)
    infos: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    seconds: float = 0.0

    def discard(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            with _building_lock:
                _building.discard(self.folder)


def building() -> set[Path]:
    with _building_lock:
        return set(_building)


class _Strings(Sequence):
    """A string column as a sequence, made Python strings on first read."""

    def __init__(self, column: pa.ChunkedArray):
        self._column, self._items = column, None

    def _list(self) -> list:
        if self._items is None:
            self._items = self._column.to_pylist()
        return self._items

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self):
        return iter(self._list())

    def __arrow_array__(self, type=None):
        col = self._column.combine_chunks()
        return col if type is None else col.cast(type)


def _take(table: pa.Table, rows: np.ndarray) -> pa.Table:
    return table.take(pa.array(rows, pa.int64())) if len(rows) != table.num_rows else table


def _matrix(parts, column: str, index: str | None) -> np.ndarray | None:
    """(n, d) float32 of a vector field over the merged rows, through the field's index (its
    stored column or its own vectors: Flat, HNSW..,Flat; NaN rows where an optional field
    has none, so missing stays missing), else the stored column."""
    out = []
    for seg, rows in parts:
        if index is not None and index in seg.indexes:
            out.append(np.asarray(seg.indexes[index].vectors(rows), dtype=np.float32))
            continue
        m = seg.docs.vector_column(column)
        if m is not None:
            out.append(np.asarray(m[rows], dtype=np.float32))
        else:
            return None
    return np.concatenate(out) if out else None


def build_merge(collection: Path, snap: Snapshot, ids: list[str], kinds: dict,
                spec_fields: dict, encodes_text: bool,
                stop: Callable[[], bool] = lambda: False, remote: bool = False) -> BuiltMerge:
    """Write the merged segment of ``ids`` (segments of ``snap``) into a temporary folder.
    ``spec_fields``: the user's vector fields (``VectorSpec.fields``). ``remote``: the files
    are written by the build process (``storage.build_worker``), which opens the same
    segments (pinned by ``snap`` meanwhile); fsync and sums stay here."""
    t0 = time.perf_counter()
    order = {s.id: i for i, s in enumerate(snap.manifest.segments)}
    ordinals = sorted(order[i] for i in ids)
    sources = [snap.manifest.segments[o].id for o in ordinals]
    lives = [snap.live[o] for o in ordinals]
    n = sum(snap.segments[o].docs.n_rows if live is None else int(live.sum())
            for o, live in zip(ordinals, lives))
    rows_in = sum(snap.manifest.segments[o].n_rows for o in ordinals)
    merged = set(ordinals)
    others = sum(e.n_rows - e.n_deleted for i, e in enumerate(snap.manifest.segments)
                 if i not in merged)  # the collection's rows besides these
    if n == 0:
        return BuiltMerge(sources, lives, None, rows_in=rows_in,
                          seconds=time.perf_counter() - t0)
    folder = collection / "segments" / f"{MERGE_PREFIX}{os.getpid()}-{next(_names)}.tmp"
    with _building_lock:
        _building.add(folder)
    built = BuiltMerge(sources, lives, folder, n, rows_in)
    try:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        failpoints.hit("merge.segment.write", folder)
        if remote:
            entries = [snap.manifest.segments[o] for o in ordinals]
            try:
                built.infos = build_worker.run(
                    "merge", "polyindex.storage.merge:write_merged_from", collection, entries,
                    lives, kinds, spec_fields, encodes_text, folder, others, stop=stop)
            except build_worker.Stopped as e:
                raise Cancelled("the collection is closing") from e
        else:
            built.infos = write_merged(folder, [(snap.segments[o], live)
                                                for o, live in zip(ordinals, lives)],
                                       kinds, spec_fields, encodes_text, others, stop)
        fsync_tree(folder, "merge.segment")
        built.files = {p.name: sum_file(p) for p in sorted(folder.iterdir())}
    except BaseException:
        built.discard()
        raise
    built.seconds = time.perf_counter() - t0
    return built


def write_merged_from(collection: Path, entries: list[SegmentEntry], lives: list, kinds: dict,
                      spec_fields: dict, encodes_text: bool, folder: Path,
                      collection_rows: int = 0) -> dict:
    """``write_merged`` in the build process: open the source segments (files checked as
    any reader checks them) and write the merged one into ``folder``."""
    sources = [(OpenedSegment(collection / "segments" / e.id, e, kinds), live)
               for e, live in zip(entries, lives)]
    return write_merged(folder, sources, kinds, spec_fields, encodes_text, collection_rows)


def write_merged(folder: Path, sources: list, kinds: dict, spec_fields: dict,
                 encodes_text: bool, collection_rows: int = 0,
                 stop: Callable[[], bool] = lambda: False, fresh: tuple | None = None) -> dict:
    """The merged segment's files in ``folder`` from ``(opened segment, live mask or None)``
    pairs: documents, id index, vectors copied, every kind built or merged. Returns the
    kinds' build infos. ``fresh``: (embeddings, tokens) of the model made again for these
    rows (``storage.reencode``: an adapted encoder): stored and built from instead of the
    sources' (every kind builds; none merges the old encoder's data)."""
    parts = [(seg, np.arange(seg.docs.n_rows, dtype=np.int64) if live is None
              else np.flatnonzero(live).astype(np.int64)) for seg, live in sources]
    vectors = {}
    for name, fs in spec_fields.items():
        column = "embedding" if name == "dense" else f"vector.{name}"
        m = _matrix(parts, column, fs.index)
        if m is not None:
            vectors[name] = m
    embeddings = _matrix(parts, "embedding", "dense" if "dense" in kinds else None) \
        if encodes_text else None
    if fresh is not None:
        embeddings = fresh[0]
    if embeddings is None:
        embeddings = vectors.get("dense")
    # Documents without their vectors, then the vectors stored as a fresh build stores
    # them (columns only where no index keeps them); one chunk, so every reader's numpy
    # views of the columns stay zero-copy.
    # (dropped before the take: a take copies every column it is given)
    tables = [_take(t.drop_columns([c for c in t.column_names
                                    if c in ("embedding", QUALITY_COLUMN, PRUNED_COLUMN)
                                    or c.startswith("vector.")]), rows)
              for t, rows in ((seg.docs.table, rows) for seg, rows in parts)]
    table = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
    # The quality column (NaN for rows of segments without one) and the pruned rows carried
    # row for row: a pruned document stays pruned, and stays out of every costly index.
    if any(QUALITY_COLUMN in seg.docs.table.column_names for seg, _ in parts):
        quality = np.concatenate([seg.docs.quality()[rows] for seg, rows in parts])
        table = table.append_column(QUALITY_COLUMN, pa.array(quality, pa.float32()))
    pruned = np.concatenate([np.zeros(len(rows), bool) if seg.docs.pruned() is None
                             else seg.docs.pruned()[rows] for seg, rows in parts]) \
        if parts else np.zeros(0, bool)
    if pruned.any():
        table = table.append_column(PRUNED_COLUMN, pa.array(pruned, pa.bool_()))
        if embeddings is not None:  # a pruned row's vector is absent (NaN) or a placeholder
            embeddings = np.array(embeddings, dtype=np.float32)
            embeddings[pruned] = 0.0
            if vectors.get("dense") is not None:
                vectors["dense"] = embeddings
    else:
        pruned = None
    column, extra = stored_columns(kinds, embeddings if encodes_text else None, vectors)
    for name, m in ([("embedding", column)] if column is not None else []) + list(extra.items()):
        flat = pa.array(np.ascontiguousarray(m, dtype=np.float32).reshape(-1))
        table = table.append_column(name, pa.FixedSizeListArray.from_arrays(flat, m.shape[1]))
    with pa.OSFile(str(folder / DOCS_FILE), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    idindex.write(folder, *idindex.merged(
        [(seg.docs.id_entries(), rows, seg.docs.n_rows) for seg, rows in parts]))
    # the texts as Python strings only for a kind that builds (~100 bytes a row per column):
    # kinds that merge from their own data never read them
    batch = BuildBatch(_Strings(table.column("id")), _Strings(table.column("title")),
                       _Strings(table.column("text")), embeddings,
                       None if fresh is None else fresh[1], vectors, collection_rows, pruned)
    infos = {}
    for name, kind in kinds.items():
        if stop():
            raise Cancelled("the collection is closing")
        if implements(kind, Merges) and fresh is None:
            infos[name] = kind.merge([(seg.indexes[name], rows) for seg, rows in parts],
                                     batch, folder)
        else:
            infos[name] = kind.build(batch, folder)
    return infos


def commit_merge(writer, built: BuiltMerge) -> SegmentEntry | None:
    """Swap the sources for the merged segment in one manifest version (under the writer).
    Returns the new entry (None when every merged row was deleted: the sources just go), or
    raises ``Cancelled`` when a source is no longer in the manifest."""
    m = writer.manifest.copy()
    pos = {e.id: i for i, e in enumerate(m.segments)}
    if any(s not in pos for s in built.sources):
        built.discard()
        raise Cancelled(f"segments {built.sources} changed under the merge")
    # Rows that died since the merge read its snapshot: tombstoned in the merged segment.
    dead = []
    for sid, live0 in zip(built.sources, built.live):
        entry = m.segments[pos[sid]]
        rows0 = np.arange(entry.n_rows) if live0 is None else np.flatnonzero(live0)
        now = load_tombstones(writer.folder, entry) if entry.tombstones else None
        dead.append(np.zeros(len(rows0), bool) if now is None else ~now[rows0])
    dead_rows = np.flatnonzero(np.concatenate(dead)) if dead else np.zeros(0, np.int64)
    first = min(pos[s] for s in built.sources)
    merged = set(built.sources)
    keep = [e for e in m.segments if e.id not in merged]
    entry = None
    if built.folder is not None and len(dead_rows) < built.n_rows:
        seg_id = f"seg-{m.next_segment:06d}"
        final = writer.folder / "segments" / seg_id
        rename(built.folder, final, "merge.segment")
        with _building_lock:
            _building.discard(built.folder)
        fsync_dir(writer.folder / "segments", "merge.segment")
        for name, expect in built.files.items():
            remember(final / name, expect)
        entry = SegmentEntry(seg_id, built.n_rows, built.infos, files=built.files)
        if len(dead_rows):
            rel = f"tombstones/{seg_id}.v{m.version + 1}.arrow"
            data = tombstone_bytes(dead_rows)
            write_file(writer.folder / rel, data, "merge.tombstones")
            fsync_dir(writer.folder / "tombstones", "merge.tombstones")
            entry.tombstones, entry.n_deleted = rel, int(len(dead_rows))
            entry.tombstones_sum = sum_bytes(data)
            remember(writer.folder / rel, entry.tombstones_sum)
        m.next_segment += 1
        keep.insert(first, entry)  # where the oldest source was: order stays write order
    else:
        built.discard()
    removed = [m.segments[pos[s]] for s in built.sources]
    m.segments = keep
    writer.manifest = commit_manifest(writer.folder, m, "merge.manifest")
    writer.garbage.extend(f"segments/{e.id}" for e in removed)
    writer.garbage.extend(e.tombstones for e in removed if e.tombstones)
    return entry
