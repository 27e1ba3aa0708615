"""Queries cost the candidates, and opened segments cost little memory (issue 17 parts 4-5).

Filter masks and dense bitmaps are cached, column statistics skip segments: none of it may
change a result (cached == uncached, exactly), and a segment whose column range excludes the
filter is not evaluated. The lexical vocabulary is found by binary search over its Arrow
column; faiss indexes are memory-mapped.
"""
from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest

import polyindex
from polyindex.index import masks
from polyindex.index.dense import kind as dense
from polyindex.index.dense import filtered as dense_filtered
from polyindex.index.lexical import vocabulary
from polyindex.index.lexical.kind import LexicalKind
from polyindex.query import filters, pipeline
from polyindex.rerank import kernels

WORDS = ["river", "stone", "bridge", "forest", "cloud", "lamp", "violet", "harbor", "candle",
         "meadow", "falcon", "copper"]
D = 8


def _docs(start, n, years, rng):
    out = []
    for i in range(start, start + n):
        words = rng.choice(WORDS, size=6)
        doc = {"id": f"d{i}", "text": " ".join(words),
               "vector": rng.standard_normal(D).astype(np.float32),
               "year": int(rng.integers(*years)), "lang": ["en", "de", "fr"][i % 3]}
        if i % 7:
            doc["score"] = float(rng.random())  # some rows have no score (null)
        out.append(doc)
    return out


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    rng = np.random.default_rng(7)
    eng = polyindex.open(tmp_path_factory.mktemp("qc") / "d")
    c = eng.create_collection("c", ["lexical", "dense:Flat", "dense@h:HNSW16,Flat"], model=None,
                              fields={"year": "int", "score": "float", "lang": "string"})
    for s, years in enumerate([(1900, 1950), (1950, 2000), (2000, 2050)]):
        docs = _docs(s * 300, 300, years, rng)
        for d in docs:
            d["vectors"] = {"h": d["vector"]}
        c.add(docs)
    c.delete([f"d{i}" for i in range(0, 900, 11)])  # tombstones in every segment
    yield c
    eng.close()


FILTERS = [
    {"year": {"gte": 1975}},
    {"year": {"gte": 2000}},
    {"year": {"lt": 1900}},
    {"year": {"gt": 1920, "lt": 1930}},
    {"year": {"in": [1910, 1960, 2010]}},
    {"year": {"nin": [1910, 1960]}},
    {"year": {"ne": 1955}},
    {"not": {"year": {"lt": 1950}}},
    {"or": [{"year": {"lt": 1905}}, {"lang": "de"}]},
    {"lang": "en", "score": {"gt": 0.5}},
    {"score": {"lte": 0.2}},
    {"not": {"score": {"gte": 0.0}}},
]
PROFILES = ["lexical", "dense", "dense@h", "hybrid"]


def _uncached(monkeypatch):
    """The pipeline as before the caches: evaluate every filter over every row, rebuild every
    dense bitmap."""
    def evaluate_all(docs, live, expr):
        m = filters.evaluate(expr, docs.table)
        return m if live is None else m & live
    monkeypatch.setattr(pipeline, "allow_mask", evaluate_all)
    monkeypatch.setattr(dense_filtered, "is_frozen", lambda m: False)


def _run(coll, flt, profile):
    if profile in ("dense", "dense@h"):
        v = np.random.default_rng(3).standard_normal(D).astype(np.float32)
        kw = {"vector": v, "using": "h"} if profile == "dense@h" else {"vector": v}
        hits = coll.query(**kw, k=25, filter=flt, profile=profile)
    elif profile == "hybrid":
        v = np.random.default_rng(3).standard_normal(D).astype(np.float32)
        hits = coll.query_batch(["river stone candle"], vectors=[v], k=25, filter=flt,
                                profile={"retrieve": [{"index": "lexical", "k": 50},
                                                      {"index": "dense", "k": 50}]})[0]
    else:
        hits = coll.query("river stone candle", k=25, filter=flt, profile=profile)
    return [(h.id, h.score) for h in hits]


def test_cached_and_uncached_results_are_equal(coll, monkeypatch):
    filters.clear_caches()
    first = {(i, p): _run(coll, f, p) for i, f in enumerate(FILTERS) for p in PROFILES}
    before = dict(filters.counters)
    again = {(i, p): _run(coll, f, p) for i, f in enumerate(FILTERS) for p in PROFILES}
    assert again == first
    assert filters.counters["evaluated"] == before["evaluated"]  # the second round: all cached
    assert filters.counters["cached"] > before["cached"]
    with monkeypatch.context() as m:
        _uncached(m)
        plain = {(i, p): _run(coll, f, p) for i, f in enumerate(FILTERS) for p in PROFILES}
    assert plain == first
    assert any(first[k] for k in first) and any(not first[k] for k in first)


def test_unfiltered_tombstoned_dense_search_equals_uncached(coll, monkeypatch):
    got = [_run(coll, None, p) for p in ("dense", "dense@h")]
    got2 = [_run(coll, None, p) for p in ("dense", "dense@h")]
    with monkeypatch.context() as m:
        _uncached(m)
        plain = [_run(coll, None, p) for p in ("dense", "dense@h")]
    assert got == got2 == plain
    assert not any(h[0] == "d11" for r in got for h in r)  # deleted


def test_column_range_skips_segments(coll):
    filters.clear_caches()
    c0 = dict(filters.counters)
    coll.query("river", k=5, filter={"year": {"gte": 1975}}, profile="lexical")
    d = {k: filters.counters[k] - c0[k] for k in c0}
    # segment 0 (1900-1949) cannot match, 2 (2000-2049) matches wholly: only 1 is evaluated
    assert d == {"evaluated": 1, "cached": 0, "none": 1, "all": 1}
    coll.query("river", k=5, filter={"year": {"gte": 1975}}, profile="dense",
               vector=np.ones(D, np.float32))
    d = {k: filters.counters[k] - c0[k] for k in c0}
    assert d == {"evaluated": 1, "cached": 3, "none": 1, "all": 1}
    # a float column with nulls: "every row" is never concluded from its range
    c1 = dict(filters.counters)
    coll.query("river", k=5, filter={"score": {"gte": -1.0}}, profile="lexical")
    assert filters.counters["evaluated"] - c1["evaluated"] == 3
    assert filters.counters["all"] == c1["all"]


def test_skipped_segment_is_not_searched(coll, monkeypatch):
    snap = coll.view()
    searched = []
    cls = type(snap.segments[0].indexes["lexical"])
    orig = cls.search
    monkeypatch.setattr(cls, "search", lambda self, *a: searched.append(self) or orig(self, *a))
    hits = coll.query("river", k=50, filter={"year": {"lt": 1950}}, profile="lexical")
    # segment 0 only; it may be asked twice (a run of equal scores straddling the 50th
    # place is completed by a deeper search: ties.ask_for)
    assert searched and {id(s) for s in searched} == {id(snap.segments[0].indexes["lexical"])}
    assert hits and all(int(h.id[1:]) < 300 for h in hits)


def test_range_plan_agrees_with_evaluation():
    """Every verdict the column statistics give (every row / no row) is what evaluation says,
    over random tables with nulls and NaN and random nested filters."""
    rng = np.random.default_rng(11)
    fields = {"a": "int", "x": "float", "s": "string"}
    ops = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]
    verdicts = {"all": 0, "none": 0, None: 0}

    def leaf():
        name = rng.choice(["a", "x", "s"])
        op = rng.choice(ops)
        if name == "s":
            v = [str(t) for t in rng.choice(list("abc"), 2)] if op in ("in", "nin") else "b"
        elif name == "a":
            v = [int(t) for t in rng.integers(-3, 8, 2)] if op in ("in", "nin") \
                else int(rng.integers(-3, 8))
        else:
            v = [float(t) for t in rng.integers(-3, 8, 2)] if op in ("in", "nin") \
                else float(rng.integers(-3, 8) / 2)
        return {name: {op: v}}

    def spec(depth=0):
        r = rng.random()
        if depth > 2 or r < 0.4:
            return leaf()
        if r < 0.6:
            return {"not": spec(depth + 1)}
        return {str(rng.choice(["and", "or"])): [spec(depth + 1) for _ in range(2)]}

    class Docs:
        def __init__(self, table):
            self.table = table
    for trial in range(60):
        n = int(rng.integers(1, 6))
        lo = int(rng.integers(0, 5))
        a = [None if rng.random() < 0.2 * (trial % 2) else int(lo + rng.integers(0, 2))
             for _ in range(n)]
        x = [None if rng.random() < 0.2 * (trial % 3 == 0) else float(rng.integers(0, 3))
             for _ in range(n)]
        if trial % 10 == 9:
            x[0] = float("nan")
        table = pa.table({"a": pa.array(a, pa.int64()), "x": pa.array(x, pa.float64()),
                          "s": pa.array([str(rng.choice(list("abc"))) for _ in range(n)])})
        docs = Docs(table)
        for _ in range(25):
            sp = spec()
            expr = filters.compile_filter(sp, fields)
            want = filters.evaluate(expr, table)
            got = filters.allow_mask(docs, None, expr)
            got = np.ones(n, bool) if got is None else got
            assert (got == want).all(), (sp, table.to_pydict())
            _, plan = filters._key_of(expr)
            verdicts[plan and plan(filters._segment_stats(docs))] += 1
    assert verdicts["all"] > 20 and verdicts["none"] > 20 and verdicts[None] > 20


def test_compile_filter_memoizes_and_keys_by_content():
    f = {"year": "int", "lang": "string"}
    a = filters.compile_filter({"year": {"gte": 3}, "lang": "en"}, f)
    b = filters.compile_filter({"lang": "en", "year": {"gte": 3}}, f)
    c = filters.compile_filter({"year": {"gte": 3.0}}, {"year": "float"})
    assert a is b and filters._key_of(a)[0] != filters._key_of(c)[0]
    big = filters.compile_filter({"year": {"in": list(range(200))}}, f)
    big2 = filters.compile_filter({"year": {"in": list(range(199)) + [500]}}, f)
    assert filters._key_of(big)[0] != filters._key_of(big2)[0]  # str() of both is the same


def test_new_live_mask_is_not_served_an_old_mask(tmp_path):
    eng = polyindex.open(tmp_path / "d")
    c = eng.create_collection("c", ["lexical"], model=None, fields={"year": "int"})
    c.add([{"id": f"d{i}", "text": "river", "year": 2000 + i % 3} for i in range(30)])
    flt = {"year": 2001}
    first = {h.id for h in c.query("river", k=30, filter=flt, profile="lexical")}
    c.delete(["d1", "d4"])
    second = {h.id for h in c.query("river", k=30, filter=flt, profile="lexical")}
    assert first - second == {"d1", "d4"} and second < first
    eng.close()


def test_identity_cache_follows_objects():
    cache = masks.IdentityLRU(4)
    a, b = np.zeros(3, bool), np.zeros(3, bool)
    cache.put((a,), "A")
    assert cache.get((a,)) == "A" and cache.get((b,)) is None
    del a
    gc.collect()
    assert len(cache) == 0  # dropped with its object
    objs = [np.zeros(1) for _ in range(6)]
    for i, o in enumerate(objs):
        cache.put((o,), i)
    assert len(cache) == 4 and cache.get((objs[0],)) is None and cache.get((objs[5],)) == 5
    sized = masks.IdentityLRU(100, max_bytes=10, size=lambda v: v)
    for o in objs[:4]:
        sized.put((o,), 4)
    assert len(sized) == 2 and sized.bytes == 8


def test_identity_cache_evicting_a_value_that_keys_another_entry():
    """A value can hold the only reference to another entry's key object (a filter that
    every row passes caches the live mask itself): evicting it runs that key's weakref
    callback inside the cache, which must not deadlock."""
    cache = masks.IdentityLRU(1)
    live = np.ones(4, bool)
    seg = np.zeros(1)
    cache.put((seg, live), live)   # the value is the key's live mask
    del live
    cache.put((np.zeros(1),), "x")  # evicts the first entry: its value was the last reference
    cache.clear()
    assert len(cache) == 0


def test_dense_bitmap_cached_only_for_frozen_masks(coll):
    seg = coll.view().segments[0].indexes["dense@h"]
    n = seg.n_rows
    frozen = masks.freeze(np.arange(n) % 2 == 0)
    assert dense_filtered.allowed(seg, frozen) is dense_filtered.allowed(seg, frozen)
    with pytest.raises(ValueError):
        frozen[0] = False  # frozen masks are read-only
    mutable = np.ones(n, bool)
    q = np.random.default_rng(5).standard_normal((1, D)).astype(np.float32)
    _, r1 = seg.search(q, 10, {"exact_below": "0"}, mutable)
    mutable[r1[0, 0]] = False  # a caller that mutates its own mask sees it respected
    _, r2 = seg.search(q, 10, {"exact_below": "0"}, mutable)
    assert r1[0, 0] not in r2[0]


def test_lexical_vocabulary_lookup(tmp_path):
    kind = LexicalKind("")
    texts = ["über straße café", "日本語 テキスト", "zebra apple", "emoji 😀 test", "a ab abc"]

    class Batch:
        ids = [str(i) for i in range(len(texts))]
        titles = [""] * len(texts)
        texts_ = texts
    batch = Batch()
    batch.texts = texts
    info = kind.build(batch, tmp_path)
    seg = kind.open(tmp_path, info)
    vocab = seg.terms()
    assert vocab == sorted(vocab) and len(vocab) == seg.n_terms
    assert isinstance(seg.term_array(), pa.Array)
    assert not any(isinstance(v, dict) and len(v) == seg.n_terms for v in vars(seg).values())
    for i, t in enumerate(vocab):
        assert seg.term_id(t) == i
    for t in ["", "zzz", "a" * 50, "ab ", "caf", "cafe", "😀x", "0"]:
        assert seg.term_id(t) is None
    probe = vocab + ["missing", vocab[0] + "x"]
    ids = seg.term_ids(probe)
    assert ids.tolist() == list(range(len(vocab))) + [-1, -1]
    # the hash table another segment's terms are summed through finds the same ids
    voff, vdata = vocabulary.string_buffers(seg.term_array())
    table = vocabulary.build_hash(voff, vdata)
    qoff, qdata = vocabulary.encode_terms(probe + ["", "zzz", "😀x", "caf"])
    found = np.zeros(len(qoff) - 1, np.int64)
    counts = [np.zeros((3, seg.n_terms), np.int64) for _ in range(2)]
    out = [np.zeros((3, len(found)), np.int64) for _ in range(2)]
    kernels.add_counts(table, voff, vdata, qoff, qdata, np.arange(len(found)), *counts, *out,
                       found)
    assert found.tolist() == list(range(len(vocab))) + [-1] * 6


def test_faiss_index_is_memory_mapped(coll):
    seg = coll.view().segments[0].indexes["dense@h"]
    path = str(seg.folder / "dense.h.faiss")
    with open("/proc/self/maps") as f:
        assert any(path in line for line in f)
    plain = dense.faiss.read_index(path)
    q = np.random.default_rng(9).standard_normal((3, D)).astype(np.float32)
    assert (plain.search(q, 10)[1] == seg.index.search(q, 10)[1]).all()
