"""A compaction workload for fault injection: a collection of many small segments with
deleted and replaced rows, then ``compact()``. Used in-process (errors) and as a script
(``python merge_workload.py DIR POINT@N``, killed at that failpoint)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import polyindex

DIM = 8


def vec(i: int, version: int = 0) -> list[float]:
    rng = np.random.default_rng(i * 7919 + version)
    return rng.standard_normal(DIM).astype(np.float32).tolist()


def setup(path: Path) -> dict[str, tuple[str, list[float]]]:
    """Build the collection (no model: lexical + user vectors); returns id -> (text, vector)
    of every live document."""
    live: dict[str, tuple[str, list[float]]] = {}
    with polyindex.open(path) as eng:
        coll = eng.create_collection("m", ["lexical", "dense:Flat"], model=None)
        for b in range(10):
            docs = []
            for i in range(b * 12, b * 12 + 12):
                docs.append({"id": f"d{i}", "text": f"w{i % 9} common v{i}", "vector": vec(i)})
            if b % 3 == 2:  # replace some earlier rows: tombstones in older segments
                for i in range(b, b * 12, 11):
                    docs.append({"id": f"d{i}", "text": f"w{i % 5} common r{b}", "vector": vec(i, b)})
            coll.add(docs)
            live.update({d["id"]: (d["text"], d["vector"]) for d in docs})
        gone = [f"d{i}" for i in range(0, 120, 13)]
        coll.delete(gone)
        for g in gone:
            live.pop(g)
    return live


def check(path: Path, live: dict[str, tuple[str, list[float]]]) -> None:
    """The collection holds exactly ``live`` (texts and vectors), queries agree, and every
    stored file verifies."""
    from polyindex.storage.verify import verify_data
    reports = verify_data(path, "m")
    assert all(r.ok for r in reports), [r.to_json() for r in reports]
    with polyindex.open(path, readonly=True) as eng:
        coll = eng.collection("m")
        assert coll.count() == len(live)
        ids = sorted(live)
        got = coll.get(ids, with_vectors=True)
        for i, doc in zip(ids, got):
            assert doc is not None, i
            assert doc.text == live[i][0], (i, doc.text, live[i][0])
            np.testing.assert_array_equal(doc.vectors["dense"], np.float32(live[i][1]))
        hits = coll.query("common", k=len(live) + 10, profile="lexical")
        assert sorted(h.id for h in hits) == ids


def leftovers(path: Path, name: str = "m") -> list[str]:
    """Files under the collection that its manifest does not name (after a writer's sweep)."""
    from polyindex.storage import gc
    from polyindex.storage.manifest import load_manifest
    folder = path / name
    return gc.sweep(folder, load_manifest(folder))


if __name__ == "__main__":
    target = Path(sys.argv[1])
    import json
    live = setup(target)
    (target.parent / f"{target.name}.live.json").write_text(json.dumps(live))
    print("setup done", flush=True)
    from polyindex.storage import failpoints
    point, _, nth = sys.argv[2].partition("@")  # armed only now: the set-up is not the subject
    failpoints.arm(point, "crash", int(nth or 1))
    with polyindex.open(target) as eng:
        eng.collection("m").compact()
    print("compacted", flush=True)
