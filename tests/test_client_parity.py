"""One behaviour suite, run against the embedded engine, the gRPC client and a sharded engine.

``polyindex.open(path)``, ``polyindex.client.remote.Client(address)`` and a sharded deployment
(the router over two shards, here in this process: ``ShardedEngine.in_process``; the Ray
actors run the same code, tests/test_ray_shards.py) must be interchangeable: same results,
same documents, same exception classes and messages.
"""
from __future__ import annotations

from itertools import count

import numpy as np
import pytest
from conftest import NEEDS_NATIVE

import polyindex
from polyindex import AlreadyExists, InputError, InvalidArgument, NotFound, ResourceExhausted
from polyindex.client.remote import Client
from polyindex.distributed.serving import ShardedEngine
from polyindex.service.server import serve
from polyindex.types import Document

DOCS = [
    {"_id": "wing", "title": "Wing flutter", "text": "Aeroelastic flutter of a swept wing at transonic speed.", "year": 1961, "lang": "en", "tags": ["aero", 1]},
    {"_id": "heat", "title": "Heat transfer", "text": "Heat transfer to a blunt body in hypersonic flow.", "year": 1965, "lang": "en"},
    {"_id": "layer", "title": "Boundary layers", "text": "Transition of the laminar boundary layer on a flat plate.", "year": 1970, "lang": "en"},
    {"_id": "cake", "title": "Chocolate cake", "text": "Bake the chocolate cake for forty minutes with butter and sugar.", "year": 1999, "lang": "en", "metadata": {"source": "book", "stars": 4.5}},
    {"_id": "pasta", "title": "Pasta", "text": "Boil the spaghetti in salted water, add tomato sauce.", "year": 2001, "lang": "it"},
    {"_id": "soccer", "title": "Football", "text": "The striker scored a late goal in the cup final.", "year": 2010, "lang": "en"},
    {"_id": "chess", "title": "Chess openings", "text": "The Sicilian defence is a sharp reply to the king pawn opening.", "year": 1980, "lang": "de"},
    {"_id": "cells", "title": "Cell biology", "text": "Mitochondria produce energy for the cell through respiration.", "year": 1995, "lang": "en"},
]
FIELDS = {"year": "int", "lang": "string"}
MIX = {"retrieve": [{"index": "lexical", "k": 50}, {"index": "dense", "k": 50}],
       "fuse": {"method": "weighted", "weights": {"lexical": 0.3, "dense": 0.7}}}
_names = count()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    eng = polyindex.open(tmp_path_factory.mktemp("embedded"))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """``clients(frontend)``: a Client of a server on that front end, started on first use."""
    servers, opened = [], {}

    def get(frontend):
        if frontend not in opened:
            servers.append(serve(tmp_path_factory.mktemp(frontend), port=0, frontend=frontend))
            # the client's transport matches: native (gRPC C++) or python (grpcio) end to end
            opened[frontend] = Client(servers[-1].address, transport=frontend)
        return opened[frontend]
    yield get
    for c in opened.values():
        c.close()
    for srv in servers:
        srv.stop(grace=2)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    eng = ShardedEngine.in_process(tmp_path_factory.mktemp("sharded"), shards=2)
    yield eng
    eng.close()


@pytest.fixture(params=["embedded", pytest.param("native", marks=NEEDS_NATIVE), "python",
                        "sharded"])
def eng(request, embedded, clients, sharded):
    """The embedded Engine, a Client (of either front end) or a sharded engine: each has
    create/collection/drop/list_collections."""
    if request.param in ("embedded", "sharded"):
        return embedded if request.param == "embedded" else sharded
    return clients(request.param)


def fresh(eng, indexes=("lexical",), docs=DOCS, **kw):
    coll = eng.create_collection(f"c{next(_names)}", list(indexes), fields=FIELDS, **kw)
    if docs:
        coll.add(docs)
    return coll


def ids(hits):
    return [h.id for h in hits]


# ---------------------------------------------------------------- the shared behaviour

def test_create_add_count_get(eng):
    coll = fresh(eng, docs=None)
    assert coll.count() == 0
    assert coll.add(DOCS + [{"id": "wing", "text": "Flutter again, second version.", "year": 1962}]) == len(DOCS)
    assert coll.count() == len(DOCS)
    got = coll.get(["wing", "cake", "nope"])
    assert got[0] == Document("wing", "", "Flutter again, second version.", {"year": 1962})
    assert got[1] == Document("cake", "Chocolate cake", DOCS[3]["text"],
                              {"source": "book", "stars": 4.5, "year": 1999, "lang": "en"})
    assert got[2] is None
    assert coll.get([]) == []
    assert coll.add([]) == 0
    info = coll.info()
    assert info["name"] == coll.name and info["documents"] == len(DOCS)
    assert info["fields"] == FIELDS and isinstance(info["version"], int)
    assert coll.name in eng.list_collections()
    assert eng.collection(coll.name).count() == len(DOCS)


def test_lexical_query_filters_explain(eng):
    coll = fresh(eng)
    hits = coll.query("chocolate butter", profile="lexical", k=3, explain=True, with_text=True)
    assert ids(hits)[0] == "cake" and hits[0].rank == 1 and hits[0].title == "Chocolate cake"
    assert hits[0].explain["stages"]["lexical"]["rank"] == 1
    assert coll.query("chocolate", k=3)[0].title is None  # no text unless asked for
    old = coll.query("transfer flow layer wing", k=10, filter={"year": {"lt": 1966}})
    assert set(ids(old)) == {"wing", "heat"}
    assert ids(coll.query("spaghetti", k=5, filter={"lang": {"in": ["it"]}})) == ["pasta"]
    assert ids(coll.query("chocolate", k=5, filter={"not": {"lang": "en"}})) == []
    inline = {"retrieve": [{"index": "lexical", "k": 5, "params": "k1=1.2,b=0.5"}]}
    assert ids(coll.query("chess pawn", profile=inline, k=1)) == ["chess"]
    batch = coll.query_batch(["chess pawn", "spaghetti"], k=1)
    assert [ids(b) for b in batch] == [["chess"], ["pasta"]]


def _same_ranking(ranking, hits):
    """``query_ids``'s answer is ``query``'s: the ids, and the scores exactly, as float64."""
    assert ranking.ids == ids(hits) and len(ranking) == len(hits)
    assert ranking.scores.dtype == np.float64 and ranking.scores.tolist() == [h.score for h in hits]
    assert ranking.hits() == hits


def test_query_ids_is_the_query_ranking(eng):
    """The arrays-only answer, through the lexical lane, a filter (the general path), a batch
    of user vectors (the dense lane and a fused pair of fields), and its errors."""
    coll = fresh(eng)
    for text, kw in (("chocolate butter", {}), ("flow heat wing", {"k": 3}),
                     ("transfer flow layer wing", {"filter": {"year": {"lt": 1966}}}),
                     ("zzzunknown", {}), ("chess pawn", {"profile": "lexical", "k": 1})):
        want = coll.query(text, **kw)
        _same_ranking(coll.query_ids(text, **kw), want)
    assert coll.query_ids("zzzunknown").ids == []
    with pytest.raises(InvalidArgument, match="k must be an integer"):
        coll.query_ids("chocolate", k=0)
    with pytest.raises(ResourceExhausted, match="k must be an integer"):
        coll.query_ids("chocolate", k=10_001)
    img, cap = _unit(40, 8, 1), _unit(40, 5, 2)
    vcoll = eng.create_collection(f"c{next(_names)}", ["dense@image:Flat", "dense:Flat"], model=None)
    vcoll.add([{"id": f"d{i}", "vector": cap[i].tolist(), "vectors": {"image": img[i]}}
               for i in range(40)])
    for kw in ({"vector": cap[4], "k": 5, "profile": "dense"}, {"vector": img[3], "using": "image", "k": 40},
               {"vector": {"image": img[5], "dense": cap[5]}, "k": 7}):
        _same_ranking(vcoll.query_ids(**kw), vcoll.query(**kw))


def test_delete(eng):
    coll = fresh(eng)
    assert coll.delete(["cake", "nope"]) == 1
    assert coll.count() == len(DOCS) - 1
    assert coll.get(["cake"]) == [None]
    assert ids(coll.query("chocolate", k=3)) == []
    assert coll.delete(["cake"]) == 0


def test_drop(eng):
    coll = fresh(eng, docs=None)
    eng.drop_collection(coll.name)
    assert coll.name not in eng.list_collections()
    with pytest.raises(NotFound, match="not found"):
        eng.collection(coll.name)


def test_errors(eng):
    coll = fresh(eng)
    with pytest.raises(InvalidArgument, match="unknown rank profile 'nope'"):
        coll.query("wing", profile="nope")
    with pytest.raises(ResourceExhausted, match="k must be"):
        coll.query("wing", k=10_001)
    for bad_k in (0, -1, True, 2.5):
        with pytest.raises(InvalidArgument, match="k must be"):
            coll.query("wing", k=bad_k)
    with pytest.raises(InvalidArgument, match="not a declared field"):
        coll.query("wing", filter={"colour": "red"})
    with pytest.raises(InvalidArgument, match="unknown operator"):
        coll.query("wing", filter={"year": {"between": [1, 2]}})
    with pytest.raises(InvalidArgument, match="needs text or a vector"):
        coll.query()
    with pytest.raises(InvalidArgument, match="non-empty string"):
        coll.query("")
    with pytest.raises(InvalidArgument, match="needs a non-empty 'retrieve'"):
        coll.query("wing", profile={"fuse": {}})
    with pytest.raises(AlreadyExists):
        eng.create_collection(coll.name, ["lexical"])
    with pytest.raises(InvalidArgument, match="invalid collection name"):
        eng.create_collection("../evil", ["lexical"])
    with pytest.raises(InvalidArgument, match="unknown index kind"):
        eng.create_collection(f"c{next(_names)}", ["nope:x"])
    with pytest.raises(NotFound):
        eng.collection("no-such-collection")
    with pytest.raises(InvalidArgument, match="ids must be"):
        coll.get("wing")


def test_add_errors_are_located_and_all_or_nothing(eng):
    coll = fresh(eng, docs=None)
    bad_rows = [{"id": "ok", "text": "fine"}, {"id": "t", "title": 3, "text": "x"}]
    with pytest.raises(InputError) as e:
        coll.add(bad_rows)
    assert str(e.value) == "add():2, id='t', field 'title': field 'title' must be a string, got int"
    with pytest.raises(InputError, match="missing text"):
        coll.add([{"id": "a"}])
    with pytest.raises(InputError) as e:
        coll.add([{"id": "ok", "text": "fine"}, {"id": "y", "text": "x", "year": "old"}])
    assert (e.value.doc_id, e.value.field) == ("y", "year") and "must be int" in str(e.value)
    assert coll.count() == 0  # nothing of a failing add was written


# ---------------------------------------------------------------- identical results

@pytest.fixture(scope="module")
def dense_pair(embedded, clients, frontend):
    """The same dense + lexical collection, once embedded and once behind the server."""
    pair = []
    for eng in (embedded, clients(frontend)):
        coll = eng.create_collection(f"dense_pair_{frontend}", ["lexical", "dense"],
                                     fields=FIELDS, profiles={"mix": MIX})
        coll.add(DOCS)
        pair.append(coll)
    return pair


@pytest.fixture(scope="module")
def dense_sharded(embedded, sharded):
    """The same dense + lexical collection, embedded and on two shards."""
    pair = []
    for eng in (embedded, sharded):
        coll = eng.create_collection("dense_sharded", ["lexical", "dense"], fields=FIELDS,
                                     profiles={"mix": MIX})
        coll.add(DOCS)
        pair.append(coll)
    return pair


def _same(a, b):
    """Identical hits: ids, ranks, scores (exactly), text, explain."""
    assert ids(a) == ids(b)
    assert a == b


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["lexical", "dense", "hybrid", "mix"])
def test_same_hits_embedded_and_client(dense_pair, profile):
    emb, cli = dense_pair
    for text in ("hypersonic heat flow", "dessert recipe with cocoa", "king pawn"):
        _same(emb.query(text, profile=profile, k=5, explain=True, with_text=True),
              cli.query(text, profile=profile, k=5, explain=True, with_text=True))
    flt = {"year": {"gte": 1970}}
    _same(emb.query("flow", profile=profile, k=8, filter=flt), cli.query("flow", profile=profile, k=8, filter=flt))
    texts = ["wing flutter", "football goal", "energy in cells"]
    for a, b in zip(emb.query_batch(texts, profile=profile, k=3), cli.query_batch(texts, profile=profile, k=3)):
        _same(a, b)
    for text in ("hypersonic heat flow", "wing flutter"):  # the arrays-only answer too
        want = emb.query(text, profile=profile, k=5)
        _same_ranking(emb.query_ids(text, profile=profile, k=5), want)
        _same_ranking(cli.query_ids(text, profile=profile, k=5), want)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["lexical", "dense", "hybrid", "mix", "ltr"])
def test_same_hits_embedded_and_sharded(dense_sharded, profile):
    """Ids, ranks, scores and the explained stage ranks of two shards equal one node's."""
    one, two = dense_sharded
    for text in ("hypersonic heat flow", "dessert recipe with cocoa", "king pawn"):
        a = one.query(text, profile=profile, k=5, explain=True, with_text=True)
        b = two.query(text, profile=profile, k=5, explain=True, with_text=True)
        if profile == "ltr":  # the features' account is the same; floats summed elsewhere
            assert [(h.id, h.rank) for h in a] == [(h.id, h.rank) for h in b]
            assert [h.explain["stages"] for h in a] == [h.explain["stages"] for h in b]
            assert np.allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)
            continue
        _same(a, b)
    flt = {"year": {"gte": 1970}}
    _same(one.query("flow", profile=profile, k=8, filter=flt),
          two.query("flow", profile=profile, k=8, filter=flt))


@pytest.mark.slow
def test_vectors_and_vector_errors(dense_pair):
    emb, cli = dense_pair
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(384).astype(np.float32)
    _same(emb.query(vector=vec, profile="dense", k=4), cli.query(vector=vec, profile="dense", k=4))
    _same(emb.query("chess", vector=vec, profile="hybrid", k=4),
          cli.query("chess", vector=vec, profile="hybrid", k=4))
    vecs = rng.standard_normal((2, 384)).astype(np.float32)
    for a, b in zip(emb.query_batch(vectors=vecs, profile="dense", k=2),
                    cli.query_batch(vectors=vecs, profile="dense", k=2)):
        _same(a, b)
    nan = vec.copy()
    nan[3] = np.nan
    for coll in dense_pair:
        with pytest.raises(InvalidArgument, match="NaN"):
            coll.query(vector=nan, profile="dense")
        with pytest.raises(InvalidArgument, match="dimension|shape"):
            coll.query(vector=vec[:10], profile="dense")
    assert emb.get(["cake", "x"]) == cli.get(["cake", "x"])
    assert emb.count() == cli.count()


# ---------------------------------------------------------------- user vectors, both ways

def _unit(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_user_vectors_named_fields(eng):
    """Upsert with packed vectors per named field, query by each, by both, read them back."""
    img, cap = _unit(40, 8, 1), _unit(40, 5, 2)
    coll = eng.create_collection(f"c{next(_names)}", ["dense@image:Flat", "dense:metric=l2,Flat"],
                                 model=None)
    docs = [{"id": f"d{i}", "vector": cap[i].tolist(), "vectors": {"image": img[i]}}
            for i in range(40)]
    assert coll.add(docs) == 40
    assert ids(coll.query(vector=img[3], using="image", k=2))[0] == "d3"
    assert ids(coll.query(vector=cap[4], k=2, profile="dense"))[0] == "d4"
    assert ids(coll.query(vector={"image": img[5], "dense": cap[5]}, k=1)) == ["d5"]
    batch = coll.query_batch(vectors=[img[6], img[7]], using="image", k=1)
    assert [ids(h) for h in batch] == [["d6"], ["d7"]]
    got = coll.get(["d9"], with_vectors=True)[0]
    assert np.array_equal(got.vectors["image"], img[9]) and np.array_equal(got.vectors["dense"], cap[9])
    assert coll.get(["d9"])[0].vectors is None
    bad = [dict(docs[0], id="n0"), {"id": "n1", "vector": cap[1].tolist(),
                                    "vectors": {"image": [1.0] * 7}}]
    with pytest.raises(InputError, match=r"add\(\):2, id='n1', field 'vectors.image'.*dimension 7"):
        coll.add(bad)
    bad = [{"id": "n2", "vector": [float("nan")] * 5, "vectors": {"image": img[0]}}]
    with pytest.raises(InputError, match="component 0 is nan"):
        coll.add(bad)
    assert coll.count() == 40 and coll.get(["n0"]) == [None]
    with pytest.raises(InvalidArgument, match="no vector field 'nope'"):
        coll.query(vector=img[0], using="nope")


# ---------------------------------------------------------------- data operations (issue 41)

def _scroll_all(coll, **kw):
    """Every page of a scroll: (documents in order, number of pages)."""
    out, cursor, pages = [], None, 0
    while True:
        page = coll.scroll(cursor=cursor, **kw)
        out += page.documents
        pages += 1
        if page.cursor is None:
            return out, pages
        cursor = page.cursor


def test_count_with_a_filter(eng):
    coll = fresh(eng)
    assert coll.count() == len(DOCS)
    assert coll.count({"lang": "en"}) == 6
    assert coll.count({"year": {"gte": 1990}, "lang": "en"}) == 3
    assert coll.count({"or": [{"lang": "de"}, {"lang": "it"}]}) == 2
    assert coll.count({"year": {"gt": 3000}}) == 0
    with pytest.raises(InvalidArgument, match="not a declared field"):
        coll.count({"colour": "red"})


def test_delete_where(eng):
    coll = fresh(eng)
    assert coll.delete_where({"year": {"lt": 1966}}) == 2  # wing, heat
    assert coll.count() == len(DOCS) - 2
    assert coll.get(["wing", "heat", "layer"])[:2] == [None, None]
    assert ids(coll.query("hypersonic heat", k=3)) == []
    assert coll.delete_where({"year": {"lt": 1966}}) == 0
    with pytest.raises(InvalidArgument, match="non-empty JSON object"):
        coll.delete_where({})
    with pytest.raises(InvalidArgument, match="not a declared field"):
        coll.delete_where({"colour": "red"})
    assert coll.count() == len(DOCS) - 2


def test_scroll_pages_every_document_once_in_one_order(eng):
    from polyindex.query.scan import position
    coll = fresh(eng)
    docs, pages = _scroll_all(coll, limit=3)
    assert [d.id for d in docs] == sorted((d["_id"] for d in DOCS), key=position)
    assert pages == 3  # 3 + 3 + 2: no empty last page
    assert docs == coll.get([d.id for d in docs])  # the documents get returns
    again, _ = _scroll_all(coll, limit=len(DOCS))
    assert again == docs
    en, _ = _scroll_all(coll, limit=2, filter={"lang": "en"}, fields=["year"])
    assert sorted(d.id for d in en) == ["cake", "cells", "heat", "layer", "soccer", "wing"]
    assert all(set(d.metadata) == {"year"} for d in en)
    with_vec = coll.scroll(limit=1, with_vectors=True).documents[0]
    assert not with_vec.vectors  # a lexical collection stores no vector
    with pytest.raises(InvalidArgument, match="cursor"):
        coll.scroll(cursor="garbage!")
    with pytest.raises(InvalidArgument, match="scroll limit must be"):
        coll.scroll(limit=0)
    with pytest.raises(ResourceExhausted, match="scroll limit must be"):
        coll.scroll(limit=10_001)


def test_fields_choose_the_metadata_a_hit_carries(eng):
    coll = fresh(eng)
    hit = coll.query("chocolate", k=1, fields=["stars", "year", "nope"])[0]
    assert hit.id == "cake" and hit.metadata == {"stars": 4.5, "year": 1999}
    assert hit.text is None
    hit = coll.query("chocolate", k=1, with_text=True, fields=["lang"])[0]
    assert hit.metadata == {"lang": "en"} and hit.title == "Chocolate cake"
    assert coll.query_batch(["chess pawn"], k=1, fields=["lang"])[0][0].metadata == {"lang": "de"}
    assert coll.get(["cake", "nope"], fields=["source"]) == [
        Document("cake", "Chocolate cake", DOCS[3]["text"], {"source": "book"}), None]
    with pytest.raises(InvalidArgument, match="fields must be"):
        coll.get(["cake"], fields="lang")


def test_scroll_under_concurrent_writes(eng):
    """Each page reads the newest snapshot: what is there for the whole scroll comes exactly
    once, what is deleted before its page never, nothing twice."""
    coll = eng.create_collection(f"c{next(_names)}", ["lexical"], fields=FIELDS)
    coll.add([{"id": f"d{i:03d}", "text": f"doc {i}", "year": i} for i in range(120)])
    seen, cursor, n = [], None, 0
    while True:
        page = coll.scroll(limit=11, cursor=cursor)
        seen += [d.id for d in page.documents]
        n += 1
        if n == 2:  # between pages: new documents, updates, deletes
            coll.add([{"id": f"new{i}", "text": "late", "year": 1} for i in range(30)]
                     + [{"id": "d005", "text": "changed", "year": 5}])
            coll.delete(["d010", "d011"])
            gone = {"d010", "d011"} - set(seen)
        if page.cursor is None:
            break
        cursor = page.cursor
    assert len(seen) == len(set(seen))
    assert {f"d{i:03d}" for i in range(120)} - gone <= set(seen)
    assert not gone & set(seen)


def test_export_then_index_is_an_equal_collection(eng, tmp_path):
    """Export (any implementation, through its scroll), index the file into a new embedded
    collection: the same documents, stored vectors and user-vector answers."""
    from polyindex.ingest.export import export
    img, cap = _unit(60, 8, 3), _unit(60, 5, 4)
    indexes = ["lexical", "dense@image:Flat", "dense:metric=l2,Flat"]
    src = eng.create_collection(f"c{next(_names)}", indexes, model=None, fields=FIELDS)
    docs = [{"id": f"d{i}", "title": f"T{i}" if i % 4 else "", "text": f"text {i} " + "red" * (i % 3),
             "year": 1950 + i, **({"lang": "en"} if i % 2 else {}), "tags": {"n": i, "l": [1, "a"]},
             "vector": cap[i].tolist(), "vectors": {"image": img[i]}} for i in range(60)]
    src.add(docs[:30])
    src.add(docs[30:])
    src.delete(["d7"])
    path = tmp_path / "out.parquet"
    assert export(path, src.info(), src.count(), src.scroll, page=7) == 59
    back_eng = polyindex.open(tmp_path / "back")
    try:
        back = back_eng.create_collection("back", indexes, model=None, fields=FIELDS)
        back.index(path)
        every = [f"d{i}" for i in range(60)]
        assert back.get(every) == src.get(every)
        for a, b in zip(src.get(every, with_vectors=True), back.get(every, with_vectors=True)):
            assert (a is None) == (b is None)
            if a is not None:
                assert sorted(a.vectors) == sorted(b.vectors) == ["dense", "image"]
                assert all(np.array_equal(a.vectors[f], b.vectors[f]) for f in a.vectors)
        for i in (3, 11, 40):
            _same(src.query(vector=img[i], using="image", k=5),
                  back.query(vector=img[i], using="image", k=5))
            _same(src.query(vector=cap[i], profile="dense", k=5),
                  back.query(vector=cap[i], profile="dense", k=5))
        assert back.count({"lang": "en"}) == src.count({"lang": "en"})
    finally:
        back_eng.close()
