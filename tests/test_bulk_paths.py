"""The faster bulk path (issue 43) answers as the old one did.

Two changes to how a lexical + IVF-PQ collection is built: the IVF,PQ template is trained
without faiss's polysemous step (it only relabels PQ centroids), and merges copy the
sources' IVF codes instead of encoding every vector again. The old path is still reachable
through ``index.dense.kind.POLYSEMOUS`` / ``MERGE_CODES``; the same documents built both ways
must give the same top 10, lexical and dense, before and after compaction."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

import polyindex
from polyindex.index.dense import kind as dense_kind

DIM = 32
VOCAB = np.array([f"w{i}" for i in range(500)])


def _docs(start: int, n: int):
    rng = np.random.default_rng([7, start])
    centres = np.random.default_rng(0).standard_normal((20, DIM)).astype(np.float32)
    v = centres[rng.integers(20, size=n)] + 0.4 * rng.standard_normal((n, DIM), np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    p = 1.0 / np.arange(1, len(VOCAB) + 1)
    words = rng.choice(len(VOCAB), size=(n, 12), p=p / p.sum())
    return [{"id": f"d{start + i}", "text": " ".join(VOCAB[words[i]]), "vector": v[i]}
            for i in range(n)]


def _answers(coll, rounds: int = 25):
    rng = np.random.default_rng(3)
    out = []
    for _ in range(rounds):
        q = rng.standard_normal(DIM).astype(np.float32)
        q /= np.linalg.norm(q)
        text = " ".join(rng.choice(VOCAB[:200], 3))
        dense = coll.query(vector=q, k=10, profile="dense")
        lexical = coll.query(text, k=10, profile="lexical")
        out.append(([h.id for h in dense], [h.score for h in dense],
                    [h.id for h in lexical], [h.score for h in lexical]))
    return out


def _build(path, old: bool, monkeypatch, deletes=()):
    monkeypatch.setattr(dense_kind, "POLYSEMOUS", old)
    monkeypatch.setattr(dense_kind, "MERGE_CODES", not old)
    eng = polyindex.open(path)
    coll = eng.create_collection("c", ["lexical", "dense:IVF16,PQ4"], model=None)
    for s in range(0, 3000, 1000):
        coll.add(_docs(s, 1000))
    if deletes:
        coll.delete(list(deletes))
    return eng, coll


def _same(a, b):
    for (di, ds, li, ls), (di2, ds2, li2, ls2) in zip(a, b):
        assert di == di2 and li == li2
        np.testing.assert_allclose(ds, ds2, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ls, ls2, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the old path trains polysemous codes: ~40 s a build
@pytest.mark.parametrize("deletes", [(), tuple(f"d{i}" for i in range(0, 3000, 7))])
def test_fast_path_top10_equals_old_path(tmp_path, monkeypatch, deletes):
    eng_old, old = _build(tmp_path / "old", True, monkeypatch, deletes)
    before_old = _answers(old)
    old.compact()
    after_old = _answers(old)
    eng_new, new = _build(tmp_path / "new", False, monkeypatch, deletes)
    before_new = _answers(new)
    new.compact()
    after_new = _answers(new)
    assert len(new.view().segments) == len(old.view().segments) == 1
    assert new.count() == old.count() == 3000 - len(deletes)
    _same(before_old, before_new)
    _same(after_old, after_new)
    _same(before_new, after_new)  # a merge that copies codes changes no answer
    eng_old.close()
    eng_new.close()


def test_merged_codes_equal_a_fresh_encoding(tmp_path, monkeypatch):
    """The merged IVF lists (codes copied) hold exactly the codes that encoding the merged
    rows' vectors into the template gives, in the same order."""
    from polyindex.index.dense import merge as dense_merge
    eng, coll = _build(tmp_path / "c", False, monkeypatch,
                       tuple(f"d{i}" for i in range(0, 3000, 5)))
    copied = []
    real = dense_merge.merge_codes
    monkeypatch.setattr(dense_merge, "merge_codes", lambda *a: copied.append(1) or real(*a))
    coll.compact()
    assert copied  # the merge copied codes (not the re-encoding fallback)
    seg = coll.view().segments[0]
    merged = seg.indexes["dense"].index
    kind = coll.table.kinds["dense"]
    fresh = faiss.clone_index(kind.template)
    fresh.add(np.ascontiguousarray(seg.indexes["dense"].vectors(np.arange(seg.docs.n_rows))))
    assert merged.ntotal == fresh.ntotal == 2400
    a, b = faiss.extract_index_ivf(merged).invlists, faiss.extract_index_ivf(fresh).invlists
    for l in range(16):
        n = a.list_size(l)
        assert n == b.list_size(l)
        ids_a = faiss.rev_swig_ptr(a.get_ids(l), n)
        ids_b = faiss.rev_swig_ptr(b.get_ids(l), n)
        assert np.array_equal(ids_a, ids_b)
        cs = a.code_size
        assert np.array_equal(faiss.rev_swig_ptr(a.get_codes(l), n * cs),
                              faiss.rev_swig_ptr(b.get_codes(l), n * cs))
    eng.close()


def test_template_trained_without_polysemous(tmp_path, monkeypatch):
    eng, coll = _build(tmp_path / "c", False, monkeypatch)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(coll.table.kinds["dense"].template))
    assert not ivf.do_polysemous_training
    assert ivf.polysemous_ht == 0  # searches use the ADC tables either way
    eng.close()


TEXTS = ["The cafés of Zürich", "", None, "a b c-d e_f GO go 42 x1 __ _a",
         "ÉCOLE école İstanbul ß",
         "running runs RUNNER, ran; the And of", "snake_case and CamelCase2 9am", "\t\n  ",
         "über-naïve coöperation", "Mixed ascii then ünïcode words here"] * 3


def test_columns_analysis_equals_per_text():
    from polyindex.index.lexical.analyzer import Analyzer
    a = Analyzer()
    terms, flat, lens = a.analyze_columns(TEXTS)
    expect = a.analyze_many(t or "" for t in TEXTS)
    assert lens.tolist() == [len(e) for e in expect]
    assert terms == sorted({t for e in expect for t in e})
    assert [terms[i] for i in flat] == [t for e in expect for t in e]


def test_lexical_build_files_equal_per_text_build(tmp_path, monkeypatch):
    import pyarrow as pa
    from polyindex.index.lexical import kind as lexical
    from polyindex.index.protocol import BuildBatch
    rng = np.random.default_rng(5)
    texts = [" ".join(rng.choice(VOCAB, 20)) + " " + (TEXTS[i % len(TEXTS)] or "")
             if i % 4 else None for i in range(300)]
    titles = [None if i % 3 else f"Title {i} {TEXTS[i % len(TEXTS)]}" for i in range(300)]
    batch = BuildBatch([f"d{i}" for i in range(300)], titles, texts)
    out = {}
    for columns in (True, False):
        monkeypatch.setattr(lexical, "ANALYZE_COLUMNS", columns)
        folder = tmp_path / str(columns)
        out[columns] = (lexical.LexicalKind("bm25").build(batch, folder), folder)
    assert out[True][0] == out[False][0]
    for name in out[True][0]["files"]:
        a = pa.ipc.open_file(pa.memory_map(str(out[True][1] / name))).read_all()
        b = pa.ipc.open_file(pa.memory_map(str(out[False][1] / name))).read_all()
        assert a.equals(b), name
