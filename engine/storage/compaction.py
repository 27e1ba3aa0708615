"""A collection's merges: one merge (built from a snapshot, committed under the writer), and
``compact``, merging until the policy (or ``max_segments``) is met and no deleted row is
left. The functions take the storage table (``storage.table.Table``) and, for an online
collection, its online writer (``online.writes.OnlineWrites``: its seal lock, its re-base)."""
from __future__ import annotations

import gc as pygc
import time
from contextlib import nullcontext
from typing import Sequence

from polyindex.errors import InvalidArgument
from polyindex.storage import build_worker, gc
from polyindex.storage.merge import Cancelled, build_merge, commit_merge
from polyindex.storage.merge_policy import TieredPolicy, compact_plan


def merge(table, ids: Sequence[str], stop=lambda: False, online=None,
          remote: bool | None = None) -> dict | None:
    """Merge the segments ``ids`` into one (their live rows; deleted rows dropped): built
    from a snapshot while queries and writes go on, swapped in by one commit. None when the
    segments changed under it (another merge, a drop) or ``stop()`` said so. ``remote``:
    build in the build process (default: for an online collection; the background merger
    asks for it always)."""
    if remote is None:
        remote = online is not None
    snap = table.sealed_snapshot()
    built = None
    # what is merging now, for info() (the console's "merges in progress"): a new list, so a
    # reader copying merge_stats never sees one half-changed
    table.merge_stats["merging"] = [*table.merge_stats.get("merging", ()), *ids]
    try:
        # Queries go on meanwhile: a background merge's files are written by the build
        # process, off this process's GIL (storage.build_worker).
        built = build_merge(table.folder, snap, list(ids), table.kinds,
                            table.encoding.vector_spec().fields,
                            table.encoding.encodes_text(), stop,
                            remote=remote and build_worker.enabled())
        # The online writer's seal lock: no seal commits between ours and the re-base of its
        # buffer onto the new manifest.
        with (online.seal_lock if online is not None else nullcontext()):
            with table.writer() as w:
                entry = commit_merge(w, built)
            table.refresh()
            if online is not None:
                online.rebase()
            else:  # opened here (the merged segment's files), not by the next query
                table.sealed_snapshot()
    except Cancelled:
        return None
    except BaseException:
        if built is not None:
            built.discard()
        table.merge_stats["merge_failures"] += 1
        raise
    finally:
        table.merge_stats["merging"] = [i for i in table.merge_stats["merging"] if i not in ids]
    # The sources were pinned by this merge's snapshot and by the view served until the
    # re-base: removed now, not at some later commit.
    del snap
    table.collect_garbage()
    rows_in = built.rows_in
    st = table.merge_stats
    st["merges"] += 1
    st["rows_merged"] += built.n_rows
    st["rows_reclaimed"] += rows_in - built.n_rows
    return {"sources": built.sources, "segment": entry.id if entry else None,
            "rows": built.n_rows, "rows_dropped": rows_in - built.n_rows,
            "seconds": round(built.seconds, 3)}


def compact(table, max_segments: int | None = None, on_merge=None, online=None) -> dict:
    """Merge until the merge policy is satisfied (or at most ``max_segments`` remain, as far
    as the policy's ``max_rows`` a merge allows: ``compact_plan``) and no segment keeps
    deleted rows; then remove every unreferenced file. Returns a report
    (segments, rows and bytes before and after, the merges); ``on_merge(report)`` is called
    after each merge."""
    if max_segments is not None and (not isinstance(max_segments, int)
                                     or isinstance(max_segments, bool) or max_segments < 1):
        raise InvalidArgument(f"max_segments must be a positive integer, got {max_segments!r}")
    policy = TieredPolicy.from_settings()
    before = storage_report(table)
    merges = []
    t0 = time.perf_counter()
    # bounded: concurrent deletes or cancelled merges cannot keep it busy forever
    for _ in range(2 * before["segments"] + 8):
        plan = compact_plan(table.sealed_snapshot().manifest.segments, policy, max_segments)
        if plan is None:
            break
        report = merge(table, plan, online=online)
        if report is None:
            continue
        merges.append(report)
        if on_merge is not None:
            on_merge(report)
    pygc.collect()  # snapshots only a reference cycle still holds stop pinning their files
    with table.writer():
        table._swept = False  # a full sweep on the way out
    return {"collection": table.name, "before": before, "after": storage_report(table),
            "merges": merges, "seconds": round(time.perf_counter() - t0, 3)}


def storage_report(table) -> dict:
    """Segments, rows and bytes of the committed manifest (no buffered writes)."""
    m = table.sealed_snapshot().manifest
    return {"segments": len(m.segments), "rows": sum(s.n_rows for s in m.segments),
            "deleted_rows": sum(s.n_deleted for s in m.segments),
            **gc.disk_usage(table.folder, m)}
