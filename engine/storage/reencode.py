"""Re-encoding a collection with another encoder (``polyindex adapt``, ``adapt --revert``):
every segment rebuilt from its stored texts, all swapped in by one manifest commit that also
names the new encoder, so no snapshot ever holds vectors of two encoders.

Each segment is rebuilt whole (every row, deleted ones too): row numbers do not move, so the
segment's tombstone file, whatever it says at commit time, is carried over to the rebuilt
segment as it is (deletes that land while the collection is re-encoded are kept without a
second look). The rebuild is ``merge.write_merged`` with the fresh vectors (documents, id
index, user vectors copied; every kind built from the new embeddings and tokens).

Resumable: the rebuilt segments are written under ``adapt/<work>/`` (not ``segments/``:
garbage collection never takes them), each as ``<seg>.tmp`` then, fsynced and summed,
renamed to ``<seg>`` with ``<seg>.json`` (its build infos and file sums) written last; a
rerun with the same work name reuses every segment whose listing is there and whose files
still check. ``commit`` (under the writer) rebuilds what arrived since (segments the
snapshot did not have: seals, ingests, merges) with the same encoder, renames every rebuilt
folder into ``segments/`` and commits. Failpoints: ``adapt.segment`` (the rebuilt folder's
fsyncs, its renames), ``adapt.manifest`` (the commit).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

from polyindex.errors import Corrupt, check_cancelled
from polyindex.storage import failpoints
from polyindex.storage.fsutil import fsync_dir, fsync_tree, rename, rmtree, write_json_atomic
from polyindex.storage.integrity import check_folder, remember, sum_file
from polyindex.storage.manifest import SegmentEntry, commit_manifest
from polyindex.storage.merge import write_merged
from polyindex.storage.snapshot import OpenedSegment
from polyindex.storage.writer import encode_kept
from polyindex.types import Document

WORK = "adapt"
POINT = "adapt.segment"

# encode(texts, on_batch) -> embeddings, or (embeddings or None, tokens): a writer's encoder
Encode = Callable


def work_dir(folder: Path, name: str) -> Path:
    d = folder / WORK / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def rebuilt(work: Path, seg_id: str) -> dict | None:
    """A finished rebuild of ``seg_id`` under ``work`` ({infos, files, n_rows}), or None."""
    listing = work / f"{seg_id}.json"
    if not listing.is_file():
        return None
    try:
        done = json.loads(listing.read_bytes())
        check_folder(work / seg_id, done["files"], "rebuilt segment")
        return done
    except (OSError, ValueError, KeyError, TypeError, Corrupt):
        return None  # torn or damaged: built again


def rebuild(work: Path, seg: OpenedSegment, kinds: dict, spec_fields: dict, encode: Encode,
            collection_rows: int, on_encoded=None) -> dict:
    """Encode ``seg``'s texts with ``encode`` and write the segment again under ``work``."""
    docs = seg.docs
    ids = docs.table.column("id").to_pylist()
    titles = docs.table.column("title").to_pylist()
    texts = docs.table.column("text").to_pylist()
    batch = [Document(i, t, x, {}) for i, t, x in zip(ids, titles, texts)]
    pruned = docs.pruned()
    emb, tokens = encode_kept(encode, batch, pruned if pruned is not None and pruned.any()
                              else None, on_encoded)
    tmp = work / f"{seg.docs.id}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    failpoints.hit(f"{POINT}.write", tmp)
    try:
        infos = write_merged(tmp, [(seg, None)], kinds, spec_fields, True, collection_rows,
                             fresh=(emb, tokens))
        fsync_tree(tmp, POINT)
        files = {p.name: sum_file(p) for p in sorted(tmp.iterdir())}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = work / seg.docs.id
    rmtree(final, POINT)
    rename(tmp, final, POINT)
    done = {"infos": infos, "files": files, "n_rows": docs.n_rows}
    write_json_atomic(work / f"{seg.docs.id}.json", done, POINT)  # fsyncs ``work`` too
    return done


def rebuild_snapshot(folder: Path, snap, work: Path, kinds: dict, spec_fields: dict,
                     encode: Encode, progress: Callable[[int, int], None] | None = None) -> int:
    """Rebuild every segment of ``snap`` not already rebuilt under ``work`` (no lock: queries
    and writes go on). ``progress(rows done, rows in all)``. Returns the rows encoded now."""
    total = sum(e.n_rows for e in snap.manifest.segments)
    done = encoded = 0
    live = snap.manifest.live_rows()
    for entry, seg in zip(snap.manifest.segments, snap.segments):
        check_cancelled("re-encoding")
        if rebuilt(work, entry.id) is None:
            base = done

            def moved(n, base=base):
                nonlocal done
                done += n
                if progress is not None:
                    progress(done, total)
            rebuild(work, seg, kinds, spec_fields, encode, live - (entry.n_rows - entry.n_deleted),
                    moved)
            encoded += entry.n_rows
            done = base + entry.n_rows
        else:
            done += entry.n_rows
        if progress is not None:
            progress(done, total)
    return encoded


def commit(writer, work: Path, kinds: dict, spec_fields: dict, encode: Encode,
           encoder: dict | None) -> dict:
    """Under the writer: rebuild the segments the manifest gained since the snapshot, then
    swap every segment for its rebuild and name ``encoder`` (the manifest's new ``encoder``
    record) in one version. Returns {segments, delta_rows, seconds}."""
    t0 = time.perf_counter()
    m = writer.manifest.copy()
    live = m.live_rows()
    delta = 0
    builds = []
    for entry in m.segments:
        done = rebuilt(work, entry.id)
        if done is None:  # arrived after the snapshot: encoded here, writes waiting
            seg = OpenedSegment(writer.folder / "segments" / entry.id, entry, kinds)
            done = rebuild(work, seg, kinds, spec_fields, encode,
                           live - (entry.n_rows - entry.n_deleted))
            delta += entry.n_rows
        if done["n_rows"] != entry.n_rows:
            raise Corrupt(f"{work / entry.id}: rebuilt with {done['n_rows']} rows, the "
                          f"segment has {entry.n_rows}")
        builds.append(done)
    old = list(m.segments)
    m.segments = []
    for entry, done in zip(old, builds):
        seg_id = f"seg-{m.next_segment:06d}"
        final = writer.folder / "segments" / seg_id
        rename(work / entry.id, final, POINT)
        for name, expect in done["files"].items():
            remember(final / name, expect)
        m.segments.append(SegmentEntry(seg_id, entry.n_rows, done["infos"],
                                       tombstones=entry.tombstones, n_deleted=entry.n_deleted,
                                       files=done["files"], tombstones_sum=entry.tombstones_sum))
        m.next_segment += 1
    fsync_dir(writer.folder / "segments", POINT)
    m.encoder = encoder
    writer.manifest = commit_manifest(writer.folder, m, "adapt.manifest")
    # the old segments' folders go (their tombstone files are the new ones' now)
    writer.garbage.extend(f"segments/{e.id}" for e in old)
    return {"segments": len(old), "delta_rows": delta,
            "seconds": round(time.perf_counter() - t0, 3)}


def discard(folder: Path) -> None:
    """Remove every unfinished rebuild (``adapt/``)."""
    rmtree(folder / WORK, "adapt.gc")
