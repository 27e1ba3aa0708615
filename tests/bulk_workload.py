"""The bulk-ingest workload of the failpoint campaign: a JSONL source indexed in segments of
``SEGMENT`` records, and the check that a collection holds exactly the records of its
committed segments (a prefix of the source, segment by segment: nothing half-applied)."""
from __future__ import annotations

import json
from pathlib import Path

import polyindex
from polyindex.storage.verify import verify_data

DOCS = 30
SEGMENT = 6


def source(folder: Path) -> Path:
    """The source: ``DOCS`` records, the last one replacing an earlier id (last write wins
    inside a segment)."""
    path = folder / "docs.jsonl"
    rows = [{"id": f"b{i}", "text": f"alpha bulk {i}"} for i in range(DOCS - 1)]
    rows.append({"id": f"b{DOCS - 3}", "text": "alpha bulk replaced"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def create(path: Path) -> None:
    with polyindex.open(path) as eng:
        eng.create_collection("b", ["lexical"], model=None, segment_size=SEGMENT)


def index(path: Path, src: Path) -> None:
    with polyindex.open(path) as eng:
        eng.collection("b").index(src, progress=False)


def expected(src: Path, records: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in src.read_text().splitlines()[:records]:
        row = json.loads(line)
        out[row["id"]] = row["text"]
    return out


def check(path: Path, src: Path, complete: bool) -> int:
    """The collection holds the first k segments' records for some k (all when
    ``complete``), every file verifies; returns the records it covers."""
    reports = verify_data(path, "b")
    assert all(r.ok for r in reports), [r.to_json() for r in reports]
    with polyindex.open(path, readonly=True) as eng:
        coll = eng.collection("b")
        hits = coll.query("alpha", profile="lexical", k=10_000)
        got = {d.id: d.text for d in coll.get([h.id for h in hits])}
        assert coll.count() == len(got)
    prefixes = [DOCS] if complete else list(range(0, DOCS, SEGMENT)) + [DOCS]
    for n in prefixes:
        if got == expected(src, n):
            return n
    raise AssertionError(f"not a prefix of whole segments: {len(got)} documents "
                         f"{sorted(got)[:8]}...")


if __name__ == "__main__":  # python bulk_workload.py DATA SOURCE: index (killed at a failpoint)
    import sys
    index(Path(sys.argv[1]), Path(sys.argv[2]))
