"""Optional named vector fields: documents may leave them out, and a search by the field only
ever returns documents that have it (issue 18)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import polyindex
from polyindex.errors import InputError, InvalidArgument


def vecs(n, d=16, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def has_field(i):
    return i % 3 != 0  # a third of the documents leave the field out


def records(x, n0=0):
    return [{"id": f"d{i}", "text": f"doc {i}",
             **({"vectors": {"image": x[i]}} if has_field(i) else {})}
            for i in range(n0, len(x))]


def brute_present(x, q, k):
    """numpy reference over only the rows that have the field (inner product)."""
    rows = np.array([i for i in range(len(x)) if has_field(i)])
    s = q @ x[rows].T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return rows[order]



def _ids(hits):
    return [h.id for h in hits]


def test_factory_syntax():
    from polyindex.index.registry import from_factory
    kind = from_factory("dense@image:dim=8,metric=cosine,optional,HNSW32,Flat")
    assert kind.optional and kind.factory == "HNSW32,Flat"
    assert from_factory(kind.describe()).optional
    with pytest.raises(InvalidArgument, match="needs its dimension declared"):
        from_factory("dense@image:optional,Flat")
    with pytest.raises(InvalidArgument, match="only a named field can be optional"):
        from_factory("dense:dim=8,optional,Flat")


@pytest.mark.parametrize("factory", ["Flat", "HNSW16,Flat", "IVF8,PQ4x4"])
def test_missing_vectors_are_never_found(eng, factory):
    """ip with vectors scored negative: a zero placeholder (score 0) would outrank them."""
    x = vecs(300, 8)
    coll = eng.create_collection("v", ["lexical", f"dense@image:dim=8,optional,{factory}"],
                                 model=None, segment_size=100)
    coll.add(records(x))
    q = -x[1:2]  # the query's own document scores most negative; most others near 0
    n_present = sum(has_field(i) for i in range(300))
    # the index holds present rows only: an IVF search sees them all once it probes every list
    prof = ({"retrieve": [{"index": "dense@image", "k": 300, "params": "nprobe=8"}]}
            if factory.startswith("IVF") else None)
    hits = coll.query(vector=q[0], using="image", k=300, profile=prof)
    ids = _ids(hits)
    assert len(ids) == n_present
    assert all(has_field(int(i[1:])) for i in ids)
    if factory != "IVF8,PQ4x4":  # exact scores: every present row, ordered as numpy orders them
        assert ids == [f"d{r}" for r in brute_present(x, q, 300)[0]]
    got = coll.get(["d0", "d1"], with_vectors=True)
    assert "image" not in got[0].vectors  # absent, not zeros
    assert np.array_equal(got[1].vectors["image"], x[1])


def test_recall_against_numpy_over_present_rows(eng):
    x = vecs(3000, 24, seed=3)
    coll = eng.create_collection("v", ["dense@image:dim=24,optional,HNSW32,Flat"], model=None)
    coll.add(records(x))
    q = vecs(30, 24, seed=9)
    ref = brute_present(x, q, 10)
    hit = 0
    for qi in range(len(q)):
        ids = _ids(coll.query(vector=q[qi], using="image", k=10))
        assert all(has_field(int(i[1:])) for i in ids)
        hit += len(set(ids) & {f"d{r}" for r in ref[qi]})
    recall = hit / (10 * len(q))
    print(f"optional field HNSW32 recall@10 vs numpy over present rows: {recall:.3f}")
    assert recall >= 0.95


def test_a_required_field_still_refuses_a_missing_vector(eng):
    x = vecs(10, 4)
    coll = eng.create_collection("v", ["dense@image:dim=4,optional,Flat", "dense@tag:dim=4,Flat"],
                                 model=None)
    docs = [{"id": f"d{i}", "vectors": {"image": x[i], "tag": x[i]}} for i in range(10)]
    docs[6] = {"id": "d6", "vectors": {"image": x[6]}}
    with pytest.raises(InputError, match=r"add\(\):7, id='d6', field 'vectors.tag'.*missing"):
        coll.add(docs)
    assert coll.count() == 0
    docs[6] = {"id": "d6", "text": "no image", "vectors": {"tag": x[6]}}
    assert coll.add(docs) == 10
    assert "d6" not in _ids(coll.query(vector=x[6], using="image", k=10))
    assert _ids(coll.query(vector=x[6], using="tag", k=1)) == ["d6"]


@pytest.mark.parametrize("factory", ["HNSW16,Flat", "IVF4,PQ4x4"])
def test_missing_stays_missing_through_merge_and_reopen(tmp_path, factory):
    x = vecs(240, 8, seed=1)
    eng = polyindex.open(tmp_path / "data")
    coll = eng.create_collection("v", [f"dense@image:dim=8,optional,{factory}"], model=None,
                                 segment_size=1000)
    for start in range(0, 240, 60):  # four segments
        coll.add(records(x[:start + 60], start))
    coll.delete(["d4", "d5"])
    assert len(coll.table.sealed_snapshot().segments) == 4
    # every IVF list probed: the exact set of present rows comes back
    prof = ({"retrieve": [{"index": "dense@image", "k": 200, "params": "nprobe=4"}]}
            if factory.startswith("IVF") else None)
    before = _ids(coll.query(vector=x[2], using="image", k=200, profile=prof))
    coll.compact(max_segments=1)
    assert len(coll.table.sealed_snapshot().segments) == 1
    after = _ids(coll.query(vector=x[2], using="image", k=200, profile=prof))
    n_present = sum(has_field(i) for i in range(240) if i not in (4, 5))
    assert len(after) == n_present and sorted(after) == sorted(before)
    eng.close()
    coll = polyindex.open(tmp_path / "data").collection("v")
    got = coll.get(["d3", "d7"], with_vectors=True)
    assert got[0].vectors == {} and np.array_equal(got[1].vectors["image"], x[7])
    assert sorted(_ids(coll.query(vector=x[2], using="image", k=200, profile=prof))) \
        == sorted(after)


def test_jsonl_missing_key_and_parquet_null(eng, tmp_path):
    x = vecs(50, 4)
    (tmp_path / "v.jsonl").write_text("".join(
        json.dumps({"id": f"d{i}", "text": "t", **({"vectors": {"image": x[i].tolist()}}
                                                   if has_field(i) else {})}) + "\n"
        for i in range(50)))
    coll = eng.create_collection("v", ["lexical", "dense@image:dim=4,optional,Flat"], model=None)
    coll.index(tmp_path / "v.jsonl")
    assert len(coll.query(vector=x[1], using="image", k=50)) == sum(map(has_field, range(50)))
    col = pa.array([x[i].tolist() if has_field(i) else None for i in range(50)],
                   pa.list_(pa.float32(), 4))
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(50)], "text": ["t"] * 50,
                             "vector.image": col}), tmp_path / "v.parquet")
    coll2 = eng.create_collection("w", ["lexical", "dense@image:dim=4,optional,Flat"], model=None)
    coll2.index(tmp_path / "v.parquet")
    assert coll2.count() == 50
    ids = _ids(coll2.query(vector=x[1], using="image", k=50))
    assert len(ids) == sum(map(has_field, range(50))) and "p0" not in ids
    assert coll2.get(["p0"], with_vectors=True)[0].vectors == {}


def test_online_writes_and_wal_replay(tmp_path):
    x = vecs(60, 4, seed=2)
    eng = polyindex.open(tmp_path / "d", online=True)
    coll = eng.create_collection("v", ["lexical", "dense@image:dim=4,optional,HNSW16,Flat"],
                                 model=None)
    coll.add(records(x))
    assert len(coll.query(vector=x[1], using="image", k=60)) == sum(map(has_field, range(60)))
    shutil.copytree(tmp_path / "d", tmp_path / "crashed")  # nothing sealed yet
    eng.close()
    eng2 = polyindex.open(tmp_path / "crashed", online=True)
    coll2 = eng2.collection("v")
    ids = _ids(coll2.query(vector=x[1], using="image", k=60))
    assert len(ids) == sum(map(has_field, range(60))) and "d0" not in ids
    assert coll2.get(["d0"], with_vectors=True)[0].vectors == {}
    eng2.close()
    coll3 = polyindex.open(tmp_path / "crashed").collection("v")
    assert len(coll3.query(vector=x[1], using="image", k=60)) == sum(map(has_field, range(60)))


def test_a_segment_in_the_placeholder_layout_still_opens_and_answers_the_same(tmp_path):
    """Segments written before the compact layout hold a zero row per missing vector (build
    info without ``compact``); they must open and answer as the compact layout does."""
    import faiss
    from polyindex.storage.integrity import sum_file
    from polyindex.storage.manifest import content_checksum
    x = vecs(90, 8, seed=4)
    eng = polyindex.open(tmp_path / "data")
    coll = eng.create_collection("v", ["lexical", "dense@image:dim=8,optional,Flat"],
                                 model=None)
    coll.add(records(x))
    q = -x[1]
    want = [(h.id, round(h.score, 5)) for h in coll.query(vector=q, using="image", k=90)]
    assert len(want) == sum(has_field(i) for i in range(90))
    eng.close()
    folder = tmp_path / "data" / "v"
    data = json.loads((folder / "manifest.json").read_text())
    (seg,) = data["segments"]
    info = seg["indexes"]["dense@image"]
    assert info.pop("compact") is True
    path = folder / "segments" / seg["id"] / "dense.image.faiss"
    compact = faiss.read_index(str(path))
    assert compact.ntotal == len(want)
    old = faiss.IndexFlatIP(8)
    rows = np.zeros((90, 8), np.float32)  # the old layout: a zero placeholder per missing row
    rows[[i for i in range(90) if has_field(i)]] = compact.reconstruct_n(0, compact.ntotal)
    old.add(rows)
    faiss.write_index(old, str(path))
    seg["files"]["dense.image.faiss"] = sum_file(path)
    data["checksum"] = content_checksum(data)
    (folder / "manifest.json").write_text(json.dumps(data))
    coll = polyindex.open(tmp_path / "data").collection("v")
    dense = coll.table.sealed_snapshot().segments[0].indexes["dense@image"]
    assert dense.index.ntotal == 90 and not hasattr(dense, "inner")  # the old layout, as is
    got = [(h.id, round(h.score, 5)) for h in coll.query(vector=q, using="image", k=90)]
    assert got == want  # placeholders (score 0, above the negative scores) never come back
    assert coll.get(["d0"], with_vectors=True)[0].vectors == {}
    assert np.array_equal(coll.get(["d2"], with_vectors=True)[0].vectors["image"], x[2])


@pytest.mark.parametrize("factory", ["Flat", "HNSW16,Flat", "IVF2,Flat"])
@pytest.mark.parametrize("online", [False, True], ids=["sealed", "buffer"])
def test_a_segment_where_no_document_has_the_field_answers(tmp_path, factory, online):
    """Issue 37 defect 3: a segment (or write buffer) whose rows all leave the optional field
    out has an empty slot space; its search must pad, not index an empty slot->row map."""
    eng = polyindex.open(tmp_path / "data", online=online)
    coll = eng.create_collection("v", ["dense:dim=4,Flat", f"dense@opt:dim=3,optional,{factory}"],
                                 model=None, fields={"year": "int"})
    x = vecs(10, 4, seed=5)
    coll.add([{"id": f"n{i}", "text": "x", "metadata": {"year": 2000 + i},
               "vectors": {"dense": x[i]}} for i in range(10)])

    def queries(present):
        q = np.ones(3, np.float32)
        assert _ids(coll.query(vector=q, using="opt", k=3)) == present[:3]
        assert _ids(coll.query(vector=q, using="opt", k=3,
                               filter={"year": {"gte": 2003}})) == present[:3]
        assert [_ids(h) for h in coll.query_batch(vectors=[q, -q], using="opt", k=2)] == \
            [present[:2], present[::-1][:2]]

    queries([])  # no document has the field anywhere
    # a later batch has it: the first batch's rows still hold no present row
    coll.add([{"id": f"o{i}", "text": "y", "metadata": {"year": 2010},
               "vectors": {"dense": x[i], "opt": [3.0 - i, 3.0 - i, 3.0 - i]}}
              for i in range(3)])
    queries(["o0", "o1", "o2"])
    coll.seal()  # online: the buffer's rows become segments
    queries(["o0", "o1", "o2"])
    eng.close()


def test_through_a_server_no_document_with_the_field_is_no_hits_not_internal(tmp_path):
    """Issue 37 defect 3 as a remote user met it (INTERNAL IndexError)."""
    from polyindex.client.remote import Client
    from polyindex.service.server import serve
    srv = serve(tmp_path / "data", port=0, frontend="python")
    try:
        with Client(srv.address) as c:
            coll = c.create_collection("v", ["dense:dim=4,Flat", "dense@opt:dim=3,optional,Flat"],
                                       model=None)
            coll.add([{"id": f"n{i}", "text": "x", "vectors": {"dense": [1.0, 0.0, 0.0, float(i)]}}
                      for i in range(10)])
            assert coll.query(vector=[1, 1, 1], using="opt") == []
            coll.add([{"id": "o", "text": "y",
                       "vectors": {"dense": [0.0, 1, 0, 0], "opt": [1, 1, 1]}}])
            assert [h.id for h in coll.query(vector=[1, 1, 1], using="opt")] == ["o"]
    finally:
        srv.stop(grace=2)


@pytest.mark.parametrize("online", [False, True], ids=["sealed", "buffer"])
def test_too_few_vectors_to_train_are_searched_exactly_until_a_batch_has_enough(tmp_path, online):
    """Issue 37 defect 3's IVF variant: the first batch with the field has one vector, fewer
    than IVF2 (or a first one-document batch than IVF4,PQ2) needs to train: was a faiss
    RuntimeError (INTERNAL); now that segment is exact and a later batch trains the index."""
    import faiss
    eng = polyindex.open(tmp_path / "data", online=online)
    coll = eng.create_collection("v", ["dense:dim=4,Flat", "dense@opt:dim=3,optional,IVF2,Flat"],
                                 model=None)
    coll.add([{"id": f"n{i}", "text": "x", "vectors": {"dense": [1.0, 0, 0, i]}}
              for i in range(10)])
    coll.add([{"id": "o0", "text": "y", "vectors": {"dense": [0.0, 1, 0, 0], "opt": [3, 3, 3]}}])
    assert _ids(coll.query(vector=[1, 1, 1], using="opt")) == ["o0"]
    x = vecs(40, 3, seed=7)
    coll.add([{"id": f"o{i}", "text": "z", "vectors": {"dense": [0.0, 0, 1, i], "opt": x[i]}}
              for i in range(1, 40)])
    coll.seal()
    want = ["o0"] + [f"o{i}" for i in np.argsort(-(x[1:] @ np.ones(3)), kind="stable")[:4] + 1]
    prof = {"retrieve": [{"index": "dense@opt", "k": 5, "params": "nprobe=2"}]}
    assert _ids(coll.query(vector=[1, 1, 1], using="opt", k=5, profile=prof)) == want
    last = coll.table.sealed_snapshot().segments[-1].indexes["dense@opt"]
    assert faiss.try_extract_index_ivf(last.index) is not None  # trained once there were enough
    one = eng.create_collection("p", ["dense:dim=8,IVF4,PQ2"], model=None)
    one.add([{"id": "a", "text": "", "vectors": {"dense": np.ones(8)}}])
    assert _ids(one.query(vector=np.ones(8))) == ["a"]
    eng.close()
