"""Reads over a whole snapshot rather than a top k: count with a filter, the ids a filter
selects (delete by filter), and scroll pages with an opaque cursor.

Every one starts from the per-segment allow masks queries use (``pipeline.allow_masks``:
live rows that pass the filter, cached per segment and filter), so a filter costs numpy
over masks, not Python per document.

Scroll order is the id index's order: (xxh3_64 of the id, the id). Each segment keeps its
ids' hashes sorted (``storage/idindex``), so a page is a binary search per segment and a
read of the next rows after the cursor, never a pass over the corpus; the cursor is the
last (hash, id) returned. Each page reads the newest snapshot: a document present (and
matching) for the whole scroll is returned exactly once; one written or deleted during it
may or may not be; no id is returned twice (its place in the order is its id's). Shards
scroll the same order, so a router merges their pages by (hash, id).
"""
from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow as pa

from polyindex.errors import InvalidArgument, ResourceExhausted
from polyindex.query.pipeline import allow_masks
from polyindex.storage import idindex
from polyindex.storage.snapshot import Snapshot
from polyindex.types import Document, Page, select_fields


def count(snap: Snapshot, expr) -> int:
    if expr is None:
        return snap.count()
    return sum(seg.docs.n_rows if m is None else int(np.count_nonzero(m))
               for seg, m in zip(snap.segments, allow_masks(snap, expr)))


def matching_ids(snap: Snapshot, expr) -> list[str]:
    """The live ids that pass ``expr`` (costs the matches, plus a mask per segment)."""
    out: list[str] = []
    for seg, m in zip(snap.segments, allow_masks(snap, expr)):
        rows = np.arange(seg.docs.n_rows) if m is None else np.flatnonzero(m)
        if len(rows):
            out.extend(seg.docs.ids_at(rows))
    return out


# ------------------------------------------------------------------------- the cursor

def encode_cursor(hash_: int, doc_id: str) -> str:
    raw = json.dumps([str(hash_), doc_id], ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[int, str] | None:
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        h, doc_id = json.loads(raw)
        h = int(h)
        if not isinstance(doc_id, str) or not 0 <= h < 1 << 64:
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise InvalidArgument(f"scroll cursor {cursor[:40]!r} is not one a scroll returned")
    return h, doc_id


def position(doc_id: str) -> tuple[int, str]:
    """A document's place in scroll order."""
    return int(idindex.hash_ids([doc_id])[0]), doc_id


def check_limit(limit, cap: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= cap:
        raise (ResourceExhausted if isinstance(limit, int) and not isinstance(limit, bool)
               and limit > cap else InvalidArgument)(
            f"scroll limit must be an integer in 1..{cap}, got {limit!r}")
    return limit


# ------------------------------------------------------------------------- a page

def _allowed(rows: np.ndarray, mask) -> np.ndarray:
    return rows if mask is None else rows[mask[rows]]


def _segment_candidates(seg, mask, after, limit: int):
    """(hashes, rows) of the first ``limit`` allowed rows after ``after`` in this segment's
    hash order, and every further row tied with the last one's hash (ties go by id, later)."""
    hashes, rows = seg.docs.id_entries()
    n, start = len(hashes), 0
    got_h, got_r = [], []
    if after is not None:
        start = int(np.searchsorted(hashes, np.uint64(after[0]), "left"))
        end = int(np.searchsorted(hashes, np.uint64(after[0]), "right"))
        if end > start:  # the cursor's own hash: only ids after the cursor's
            tied = _allowed(rows[start:end].astype(np.int64), mask)
            tied = np.array([r for r, i in zip(tied.tolist(), seg.docs.ids_at(tied))
                             if i > after[1]], np.int64)
            got_h.append(np.full(len(tied), after[0], np.uint64))
            got_r.append(tied)
        start = end
    have, width = sum(map(len, got_r)), max(2 * limit, 64)
    while start < n and have < limit:
        end = min(n, start + width)
        h, r = hashes[start:end], rows[start:end].astype(np.int64)
        if mask is not None:
            keep = mask[r]
            h, r = h[keep], r[keep]
        got_h.append(h)
        got_r.append(r)
        have += len(h)
        start, width = end, width * 2
    if not got_h:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    h, r = np.asarray(np.concatenate(got_h), np.uint64), np.asarray(np.concatenate(got_r))
    if len(h) > limit:
        end = int(np.searchsorted(h, h[limit - 1], "right"))
        h, r = h[:end], r[:end]
    if len(h) and start < n and hashes[start] == h[-1]:  # a tie run past the part read
        stop = int(np.searchsorted(hashes, h[-1], "right"))
        more = _allowed(rows[start:stop].astype(np.int64), mask)
        h = np.concatenate([h, np.full(len(more), h[-1], np.uint64)])
        r = np.concatenate([r, more])
    return h, r


def page(snap: Snapshot, expr, after: tuple[int, str] | None, limit: int
         ) -> list[tuple[int, str, int, int]]:
    """Up to ``limit`` (hash, id, segment, row) after ``after``, in scroll order."""
    allow = allow_masks(snap, expr)
    hs, segs, rows = [], [], []
    for s, (seg, m) in enumerate(zip(snap.segments, allow)):
        h, r = _segment_candidates(seg, m, after, limit)
        hs.append(h)
        rows.append(r)
        segs.append(np.full(len(h), s, np.int64))
    if not hs:
        return []
    h, seg_of, row_of = np.concatenate(hs), np.concatenate(segs), np.concatenate(rows)
    order = np.argsort(h, kind="stable")
    if len(order) > limit:  # keep the whole run of the last hash: ties are ordered by id
        order = order[:int(np.searchsorted(h[order], h[order[limit - 1]], "right"))]
    # .tolist(): Python ints at once (indexing element by element costs ~1 us each, and
    # more on arrays sliced from the id index's memory map)
    picked = list(zip(h[order].tolist(), seg_of[order].tolist(), row_of[order].tolist()))
    ids: dict[tuple[int, int], str] = {}
    for s in sorted({s for _, s, _ in picked}):
        seg_rows = [r for _, ss, r in picked if ss == s]
        ids.update(((s, r), i) for r, i in zip(seg_rows, snap.segments[s].docs.ids_at(
            np.array(seg_rows, np.int64))))
    return sorted((hh, ids[(s, r)], s, r) for hh, s, r in picked)[:limit]


def stored_vectors(seg, row: int, kinds: dict) -> dict:
    """A row's stored vectors by field ("dense" and the named fields); an optional field the
    document left out reads back as NaN: absent here."""
    vecs = {k.field: seg.indexes[name].vectors(np.array([row]))[0].copy()
            for name, k in kinds.items() if k.kind == "dense"}
    return {f: v for f, v in vecs.items() if not np.isnan(v[:1]).any()}


def by_id(snap: Snapshot, ids: list[str], fields: list[str] | None, with_vectors: bool,
          kinds: dict) -> list:
    """``Collection.get``: the documents of ``ids`` (None where absent)."""
    out = []
    for loc in snap.find(ids):
        doc = None if loc is None else snap.segments[loc[0]].docs.documents([loc[1]])[0]
        if doc is not None:
            doc.metadata = select_fields(doc.metadata, fields)
            if with_vectors:
                doc.vectors = stored_vectors(snap.segments[loc[0]], loc[1], kinds)
        out.append(doc)
    return out


def documents(snap: Snapshot, picked, fields: list[str] | None, with_vectors: bool) -> list:
    """The documents of ``page``'s rows: one Arrow ``take`` per segment they fall in, then
    one conversion to Python for the page (a page in hash order touches every segment; a
    ``to_pylist`` per segment cost ~0.35 ms each)."""
    by_seg: dict[int, list[int]] = {}
    for i, (_, _, s, _) in enumerate(picked):
        by_seg.setdefault(s, []).append(i)
    declared = list(snap.manifest.config.fields)
    cols = ["id", "title", "text", "metadata_json", *declared]
    order = [i for at in by_seg.values() for i in at]
    parts = []
    for s, at in by_seg.items():
        table = snap.segments[s].docs.table  # (a field missing from a segment: no value)
        parts.append(table.select([c for c in cols if c in table.column_names]).take(
            pa.array([picked[i][3] for i in at], pa.int64())))
    try:
        rows = pa.concat_tables(parts).to_pylist() if parts else []
    except pa.ArrowInvalid:  # columns typed differently across segments: one at a time
        rows = [r for part in parts for r in part.to_pylist()]
    out: list = [None] * len(picked)
    for i, r in zip(order, rows):
        meta = json.loads(r["metadata_json"]) if r["metadata_json"] else {}
        meta.update({f: v for f in declared if (v := r.get(f)) is not None})
        doc = Document(r["id"], r["title"], r["text"], select_fields(meta, fields))
        if with_vectors:
            doc.vectors = stored_vectors(snap.segments[picked[i][2]], picked[i][3], snap.kinds)
        out[i] = doc
    return out


def scroll(snap: Snapshot, expr, cursor: str | None, limit: int, fields, with_vectors: bool):
    """A page and the cursor after it (None when nothing follows: one more row is read)."""
    picked = page(snap, expr, decode_cursor(cursor), limit + 1)
    more = len(picked) > limit
    picked = picked[:limit]
    return Page(documents(snap, picked, fields, with_vectors),
                encode_cursor(*picked[-1][:2]) if more else None)
