"""A sharded collection's data operations: count with a filter (each shard's count, summed),
delete by filter (fanned out to every shard's writer) and scroll (each shard's page after
the same cursor, merged in scroll order: ``query.scan``'s (hash of the id, id)).

Scroll over shards gives one node's order and guarantees: every shard orders its ids the
same way, so the first ``limit`` of the merged pages are the first ``limit`` of the whole
collection after the cursor; each shard reads its newest snapshot per page.
"""
from __future__ import annotations

from polyindex.query import scan
from polyindex.query.filters import compile_filter
from polyindex.types import MAX_SCROLL, Page, check_fields


def _check(coll, filter) -> None:
    """Refused here, once, with one node's error (not a shard's, nor half of them)."""
    if filter is not None:
        compile_filter(filter, coll.describe()["fields"])


def count(coll, filter) -> int:
    _check(coll, filter)
    calls = {s: ("count", coll.name, filter) for s in range(coll.n_shards)}
    return sum(coll.backend.each(calls).values())


def delete_where(coll, filter) -> int:
    _check(coll, filter if filter is not None else {})
    calls = {s: ("delete_where", coll.name, filter) for s in range(coll.n_shards)}
    return sum(coll.backend.each(calls, write=True).values())


def scroll(coll, filter, limit, cursor, fields, with_vectors) -> Page:
    _check(coll, filter)
    limit, fields = scan.check_limit(limit, MAX_SCROLL), check_fields(fields)
    scan.decode_cursor(cursor)  # a bad cursor is refused before any shard is asked
    calls = {s: ("scroll", coll.name, filter, limit, cursor, fields, with_vectors)
             for s in range(coll.n_shards)}
    pages = coll.backend.each(calls)
    docs = sorted((d for p in pages.values() for d in p.documents),
                  key=lambda d: scan.position(d.id))
    more = len(docs) > limit or any(p.cursor is not None for p in pages.values())
    docs = docs[:limit]
    return Page(docs, scan.encode_cursor(*scan.position(docs[-1].id)) if more and docs else None)
