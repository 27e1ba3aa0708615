"""The per-segment id index: exact lookups (collisions included), merged indexes equal to
fresh ones, segments written without it, and the writes that use it."""
from __future__ import annotations

import numpy as np
import pytest

import polyindex
from polyindex.storage import idindex
from polyindex.storage.segment import Segment, write_docs
from polyindex.types import Document


def _segment(tmp_path, ids, with_index=True) -> Segment:
    folder = tmp_path / "seg"
    folder.mkdir()
    write_docs(folder, [Document(i, "", f"text {i}", {}) for i in ids], {}, None)
    if not with_index:
        (folder / idindex.ID_INDEX_FILE).unlink()
    return Segment(folder, "seg-000000", len(ids))


@pytest.mark.parametrize("with_index", [True, False])
def test_lookup_finds_exactly_the_stored_ids(tmp_path, with_index):
    ids = [f"doc-{i}" for i in range(0, 3000, 3)]
    seg = _segment(tmp_path, ids, with_index)
    query = [f"doc-{i}" for i in range(0, 60)] + ["", "doc-2997", "nope"]
    expect = {d: r for r, d in enumerate(ids)}
    rows = seg.rows_of(query)
    assert rows.tolist() == [expect.get(q, -1) for q in query]
    assert np.flatnonzero(seg.contains(query)).tolist() == sorted(
        expect[q] for q in query if q in expect)


def test_hash_collisions_cost_a_comparison_never_a_wrong_row(tmp_path, monkeypatch):
    monkeypatch.setattr(idindex, "_hash", lambda b: len(b) % 3)  # nearly everything collides
    ids = [f"x{i}" for i in range(200)]
    seg = _segment(tmp_path, ids)
    query = ["x5", "x150", "x1999", "x77", "y5"]
    assert seg.rows_of(query).tolist() == [5, 150, -1, 77, -1]
    pos, rows = seg.lookup(query)
    assert sorted(zip(pos.tolist(), rows.tolist())) == [(0, 5), (1, 150), (3, 77)]


def test_a_merged_index_equals_one_built_from_the_merged_ids():
    rng = np.random.default_rng(0)
    a = [f"a{i}" for i in range(100)]
    b = [f"b{i}" for i in range(80)]
    ea = idindex.sorted_entries(idindex.hash_ids(a), np.arange(len(a)))
    eb = idindex.sorted_entries(idindex.hash_ids(b), np.arange(len(b)))
    keep_a = np.sort(rng.choice(len(a), 60, replace=False))
    keep_b = np.sort(rng.choice(len(b), 30, replace=False))
    h, r = idindex.merged([(ea, keep_a, len(a)), (eb, keep_b, len(b))])
    merged_ids = [a[i] for i in keep_a] + [b[i] for i in keep_b]
    fh, fr = idindex.sorted_entries(idindex.hash_ids(merged_ids), np.arange(len(merged_ids)))
    assert np.array_equal(h, fh) and np.array_equal(r, fr)


def test_upserts_and_deletes_through_the_index_across_segments(tmp_path):
    with polyindex.open(tmp_path) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        for b in range(6):
            coll.add([{"id": f"d{i}", "text": f"v0 word{i}"} for i in range(b * 20, b * 20 + 20)])
        coll.add([{"id": f"d{i}", "text": f"v1 word{i}"} for i in range(0, 120, 7)])
        assert coll.delete([f"d{i}" for i in range(3, 120, 10)] + ["missing"]) == 12
        docs = coll.get([f"d{i}" for i in range(120)])
        for i, d in enumerate(docs):
            if i % 10 == 3:
                assert d is None, i
            else:
                assert d.text == (f"v1 word{i}" if i % 7 == 0 else f"v0 word{i}"), i
        assert coll.count() == 108
