"""The sparse kind: numba scoring vs scipy, MaxScore vs exhaustive, the projector (save/load,
determinism), factory strings, and the kind end to end in a small collection."""
import json

import numpy as np
import pytest
import scipy.sparse as sp
from topic_docs import TOPIC_DOCS as DOCS

import polyindex
from polyindex import Corrupt, InvalidArgument
from polyindex.index import postings
from polyindex.index.sparse import kernels as sparse_kernels
from polyindex.index.protocol import BuildBatch, Query
from polyindex.index.registry import from_factory
from polyindex.index.sparse.kind import SparseKind
from polyindex.index.sparse.projector import Projector, TrainConfig, train
from polyindex.storage.segment import Segment, write_docs
from polyindex.types import Document

LUT = postings.half_lut()


def unit(n, d=32, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def codes(n, dim, k, seed, skew=1.3):
    """Random k-sparse rows with Zipf-skewed latent use (like a trained projector's)."""
    rng = np.random.default_rng(seed)
    p = rng.zipf(skew, size=dim).astype(float)
    p /= p.sum()
    gumbel = np.log(p).astype(np.float32) - np.log(-np.log(rng.random((n, dim), np.float32) * 0.999 + 1e-6))
    dims = np.argpartition(-gumbel, k, axis=1)[:, :k]  # weighted sampling without replacement
    vals = np.maximum(rng.random((n, k)) ** 3, 1e-3).astype(np.float16)  # peaked, like TopK
    return dims, vals


def index_of(dims, vals, dim):
    n, k = dims.shape
    off, docs, w = postings.build_csr(dims.ravel(), np.repeat(np.arange(n), k), vals.ravel(), dim)
    maxw = np.zeros(dim, np.float32)
    nz = np.diff(off) > 0
    maxw[nz] = np.maximum.reduceat(w.astype(np.float32), off[:-1][nz])
    mat = sp.csr_matrix((vals.ravel().astype(np.float32), dims.ravel(),
                         np.arange(0, n * k + 1, k)), shape=(n, dim))
    return off, docs, w.astype(np.float16).view(np.uint16), maxw, mat


def queries(nq, dim, kq, seed):
    dims, vals = codes(nq, dim, kq, seed)
    vals = vals.astype(np.float64)
    order = np.argsort(-vals, 1, kind="stable")  # the kind sends terms by weight, descending
    dims, vals = np.take_along_axis(dims, order, 1), np.take_along_axis(vals, order, 1)
    ptr = np.arange(0, nq * kq + 1, kq, dtype=np.int64)
    mat = sp.csr_matrix((vals.ravel(), dims.ravel(), ptr), shape=(nq, dim))
    return ptr, dims.ravel().astype(np.int64), vals.ravel(), mat


def search(kernel, index, q, k, binary=False, allow=None):
    off, docs, w, maxw, _ = index
    ptr, terms, weights, _ = q
    vals = np.zeros(0, np.uint16) if binary else w
    weights = np.ones_like(weights) if binary else weights
    counts = np.zeros(len(ptr) - 1, np.int64)
    head = (off, docs, vals, LUT) + ((maxw,) if kernel is sparse_kernels.maxscore_search else ())
    args = (*head, binary, ptr, terms, weights, counts)
    s, r = postings.run_search(kernel, args, postings.BufferPool(int(docs.max()) + 1 if len(docs) else 0),
                               len(ptr) - 1, k, allow)
    return s, r, counts


def reference_topk(scores, k, allow=None):
    """Top-k of a dense score matrix over rows with a score > 0 (matched), ties by row id."""
    out_s = np.full((len(scores), k), -np.inf, np.float32)
    out_r = np.full((len(scores), k), -1, np.int64)
    for q, row in enumerate(scores):
        ok = (row > 0) if allow is None else ((row > 0) & allow)
        cand = np.flatnonzero(ok)
        order = cand[np.lexsort((cand, -row[cand]))][:k]
        out_s[q, :len(order)], out_r[q, :len(order)] = row[order], order
    return out_s, out_r


def test_half_lut_is_exact():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = np.isfinite(bits.view(np.float16))
    assert np.array_equal(LUT[finite], bits.view(np.float16)[finite].astype(np.float32))


@pytest.mark.parametrize("binary", [False, True])
def test_numba_scorer_equals_scipy(binary):
    n, dim = 3000, 4096
    index = index_of(*codes(n, dim, 24, seed=1), dim)
    q = queries(16, dim, 24, seed=2)
    mat, qmat = index[4], q[3]
    if binary:
        mat, qmat = (mat > 0).astype(np.float64), (qmat > 0).astype(np.float64)
    ref = (qmat @ mat.T).toarray()
    allow = np.random.default_rng(3).random(n) < 0.7
    for a in (None, allow):
        s, r, _ = search(sparse_kernels.sparse_search, index, q, 20, binary, a)
        ref_s, ref_r = reference_topk(ref, 20, a)
        assert np.allclose(s, ref_s, rtol=1e-5, atol=1e-6)
        if binary:  # integer scores: the order (ties by row id) is fully determined
            assert np.array_equal(r, ref_r)
        else:
            assert (r == ref_r).mean() > 0.99  # float32 vs float64 sums may swap near-ties
        # score(): the same arithmetic as search, so exactly the same values
        out = np.empty((len(q[0]) - 1, 20), np.float32)
        weights = np.ones_like(q[2]) if binary else q[2]
        vals = np.zeros(0, np.uint16) if binary else index[2]
        for qi in range(len(q[0]) - 1):
            lo, hi = q[0][qi], q[0][qi + 1]
            sparse_kernels.sparse_score_rows(index[0], index[1], vals, LUT, binary, n,
                                       np.array([0, hi - lo]), q[1][lo:hi], weights[lo:hi],
                                       r[qi], out[qi:qi + 1])
        assert np.array_equal(np.where(r >= 0, out, -np.inf), s)


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("k", [1, 10, 100, 5000])
def test_pruned_equals_exhaustive(binary, k):
    n, dim = 4000, 4096
    for seed in range(3):
        index = index_of(*codes(n, dim, 32, seed=seed, skew=1.1 + 0.2 * seed), dim)
        q = queries(12, dim, 48, seed=10 + seed)
        allow = np.random.default_rng(seed).random(n) < 0.5
        for a in (None, allow):
            s1, r1, c1 = search(sparse_kernels.sparse_search, index, q, k, binary, a)
            s2, r2, c2 = search(sparse_kernels.maxscore_search, index, q, k, binary, a)
            assert np.array_equal(r1, r2) and np.array_equal(s1, s2)
            assert (c2 <= c1).all()
    if k == 10 and not binary:
        assert c2.sum() < c1.sum()  # the pruning does prune


def test_projector_save_load_and_determinism(tmp_path):
    x = unit(400, d=32, seed=4)
    cfg = lambda seed: TrainConfig(dim=4096, ks=(8, 16, 32), seed=seed, epochs=1, threads=1)
    p1, p2, p3 = train(x, cfg(7)), train(x, cfg(7)), train(x, cfg(8))
    assert np.array_equal(p1.w_enc, p2.w_enc) and np.array_equal(p1.bias, p2.bias)
    assert not np.array_equal(p1.w_enc, p3.w_enc)
    files = p1.save(tmp_path)
    assert sorted(files) == sorted(p.name for p in tmp_path.iterdir())
    loaded = Projector.load(tmp_path)
    q = unit(50, d=32, seed=5)
    for k in (8, 16, 40):
        v1, d1 = p1.encode(q, k)
        v2, d2 = loaded.encode(q, k)
        assert np.array_equal(v1, v2) and np.array_equal(d1, d2)
        assert v1.shape == (50, k) and (np.diff(v1, axis=1) <= 0).all() and (v1 >= 0).all()
        assert all(len(set(row)) == k for row in d1)
    assert loaded.meta["dim"] == 4096 and loaded.meta["ks"] == [8, 16, 32]


def test_decode_query_scores_against_reconstructions(tmp_path):
    """``decode_query`` weighs latent j by ``w_dec_j . q``: with every latent kept, the sparse
    dot product with a document's codes is ``q . (x_hat - b_pre)``, the query against the
    document's reconstruction; the decoder survives save/load and its top-k is the prefix."""
    x = unit(400, d=32, seed=4)
    p = train(x, TrainConfig(dim=4096, ks=(8, 16, 32), epochs=1, threads=1))
    assert p.w_dec is not None and p.w_dec.shape == (4096, 32)
    q = unit(5, d=32, seed=6)
    vals, dims = p.encode(x[:20], 32)
    z = np.zeros((20, 4096), np.float32)
    np.put_along_axis(z, dims, vals, 1)
    u = q @ p.w_dec.T
    qv, qd = p.decode_query(q, 4096)
    zq = np.zeros((5, 4096), np.float32)
    np.put_along_axis(zq, qd, qv, 1)
    np.testing.assert_allclose(zq @ z.T, np.maximum(u, 0) @ z.T, rtol=1e-5, atol=1e-6)
    top_v, top_d = p.decode_query(q, 8)
    assert np.array_equal(top_d, qd[:, :8]) and (np.diff(top_v, axis=1) <= 0).all()
    (tmp_path / "with").mkdir()
    p.save(tmp_path / "with", decoder=True)
    assert np.array_equal(Projector.load(tmp_path / "with").decode_query(q, 8)[1], top_d)
    (tmp_path / "plain").mkdir()
    p.save(tmp_path / "plain")  # a collection's artifact: no decoder
    with pytest.raises(ValueError, match="without its decoder"):
        Projector.load(tmp_path / "plain").decode_query(q, 8)


def test_recon_codes_are_least_squares_and_score_the_reconstruction(tmp_path):
    """``encode_recon`` keeps the encoder's support with the least-squares weights over its
    decoder atoms; ``recon_query`` with every latent scores q . (x_hat - centre) exactly, and a
    smaller k keeps the largest magnitudes. Both survive save/load (the decoder and centre)."""
    x = unit(400, d=32, seed=4)
    p = train(x, TrainConfig(dim=4096, ks=(8, 16, 32), epochs=1, threads=1))
    np.testing.assert_allclose(p.centre, x.mean(0), atol=1e-6)
    vals, dims = p.encode_recon(x[:20], 16)
    assert np.array_equal(np.sort(dims, 1), np.sort(p.encode(x[:20], 16)[1], 1))
    assert (np.diff(np.abs(vals), axis=1) <= 0).all() and (vals < 0).any()
    for i in range(20):  # the weights minimise the reconstruction error on that support
        atoms = p.w_dec[dims[i]]
        ref = np.linalg.lstsq(atoms.T, x[i] - p.centre, rcond=None)[0]
        np.testing.assert_allclose(vals[i], ref, rtol=1e-2, atol=2e-3)
    z = np.zeros((20, 4096), np.float32)
    np.put_along_axis(z, dims, vals, 1)
    q = unit(5, d=32, seed=6)
    qv, qd = p.recon_query(q, 4096)
    zq = np.zeros((5, 4096), np.float32)
    np.put_along_axis(zq, qd, qv, 1)
    np.testing.assert_allclose(zq @ z.T, q @ (z @ p.w_dec).T, rtol=1e-4, atol=1e-5)
    top_v, top_d = p.recon_query(q, 8)
    assert np.array_equal(top_d, qd[:, :8]) and (np.diff(np.abs(top_v), axis=1) <= 0).all()
    p.save(tmp_path, decoder=True)
    again = Projector.load(tmp_path)
    assert np.array_equal(again.encode_recon(x[:20], 16)[0], vals)


def test_recon_kind_searches_the_reconstruction_score(tmp_path):
    """A ``recon`` index returns the top-k of q . x_hat over its rows, on one segment or two;
    MaxScore is refused (signed weights), binary with recon is refused, and an artifact saved
    without its decoder is Corrupt to a recon index."""
    x, q = unit(600, seed=6), unit(5, seed=7)
    kind = from_factory("sparse:UHD4096,k=16,epochs=1,rescore=0,recon")
    assert kind.describe() == "sparse:UHD4096,k=16,k_query=4096,rescore=0,recon,epochs=1"
    assert from_factory(kind.describe()).describe() == kind.describe()
    # queries never use the encoder: its Multi-TopK set is the document k's alone
    assert kind.train_config().ks == (4, 8, 16, 32)
    ids = [str(i) for i in range(600)]
    kind.train(BuildBatch(ids, [""] * 600, ["t"] * 600, x))
    (tmp_path / "art").mkdir()
    kind.save_artifacts(tmp_path / "art")
    vals, dims = kind.projector.encode_recon(x, 16)
    z = np.zeros((600, 4096), np.float32)
    np.put_along_axis(z, dims, vals.astype(np.float16).astype(np.float32), 1)
    exact = q @ (z @ kind.projector.w_dec).T  # the stored weights' reconstruction
    segs = []
    for name, lo, hi in (("one", 0, 600), ("a", 0, 250), ("b", 250, 600)):
        folder = tmp_path / name
        batch = BuildBatch(ids[lo:hi], [""] * (hi - lo), ["t"] * (hi - lo), x[lo:hi])
        segs.append(kind.open(folder, kind.build(batch, folder), None))
    prepared = kind.prepare([Query(vector=v) for v in q], segs[:1], [None], {}, {})
    s, r = segs[0].search(prepared, 10, {}, None)
    ref = np.argsort(-exact, axis=1, kind="stable")[:, :10]
    assert np.array_equal(r, ref)
    np.testing.assert_allclose(s, np.take_along_axis(exact, ref, 1), rtol=1e-4, atol=1e-5)
    two = kind.prepare([Query(vector=v) for v in q], segs[1:], [None, None], {}, {})
    s2, r2 = kind.search_snapshot(two, segs[1:], np.array([0, 250, 600]), 10, {}, [None, None])
    assert np.array_equal(r2, r)
    with pytest.raises(InvalidArgument, match="non-negative"):
        kind.prepare([Query(vector=q[0])], segs[:1], [None], {"prune": "maxscore"}, {})
    with pytest.raises(InvalidArgument, match="exclude"):
        from_factory("sparse:UHD4096,binary,recon")
    plain = tmp_path / "plain"
    plain.mkdir()
    kind.projector.save(plain)  # the default kind's artifact: no decoder
    with pytest.raises(Corrupt, match="no decoder"):
        from_factory("sparse:UHD4096,k=16,recon").load_artifacts(plain)


def test_recon_collection_results_do_not_depend_on_segments(tmp_path):
    """Through a collection: two segments, a compaction into one and a reopen return the same
    top 10, the top 10 of q . x_hat (the decoder and centre come back from the artifact)."""
    x, q = unit(300, d=384, seed=8), unit(4, d=384, seed=9)
    coll = polyindex.open(tmp_path).create_collection(
        "r", ["dense:Flat", "sparse:UHD4096,k=16,epochs=1,rescore=0,recon"], dtype="float32")
    docs = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(300)]
    coll.add(docs[:120], embeddings=x[:120])  # the first segment trains the projector
    coll.add(docs[120:], embeddings=x[120:])

    def top(c):
        return [[h.id for h in c.query(vector=v, k=10, profile="sparse")] for v in q]
    proj = Projector.load(tmp_path / "r" / "artifacts" / "sparse")
    vals, dims = proj.encode_recon(x, 16)
    z = np.zeros((300, 4096), np.float32)
    np.put_along_axis(z, dims, vals.astype(np.float16).astype(np.float32), 1)
    exact = q @ (z @ proj.w_dec).T
    expected = [[f"d{i}" for i in np.argsort(-row, kind="stable")[:10]] for row in exact]
    assert top(coll) == expected
    coll.compact(max_segments=1)
    assert top(coll) == expected
    again = polyindex.open(tmp_path, readonly=True).collection("r")
    assert top(again) == expected


def test_factory_strings():
    kind = from_factory("sparse:UHD16384,k=64")
    assert isinstance(kind, SparseKind)
    # k_query and rescore decide what a query returns: describe() always says them
    assert kind.describe() == "sparse:UHD16384,k=64,k_query=32,rescore=400"
    assert (kind.dim, kind.k, kind.k_query, kind.binary, kind.rescore) == (16384, 64, 32, False, 400)
    kind = from_factory("sparse:UHD4096,k=16,binary,k_query=32,seed=3,epochs=5,rescore=0")
    assert kind.describe() == "sparse:UHD4096,k=16,k_query=32,rescore=0,binary,seed=3,epochs=5"
    assert from_factory(kind.describe()).describe() == kind.describe()
    assert from_factory("sparse").describe() == "sparse:UHD4096,k=64,k_query=32,rescore=400"
    for bad in ("sparse:UHD100,k=4", "sparse:UHD70000", "sparse:XYZ", "sparse:UHD4096,k=0",
                "sparse:UHD4096,k=abc", "sparse:UHD4096,foo=1", "sparse:UHD4096,epochs=0",
                "sparse:UHD4096,k_query=5000"):
        with pytest.raises(InvalidArgument):
            from_factory(bad)


def test_kind_build_open_search(tmp_path):
    x, q = unit(600, seed=6), unit(5, seed=7)
    kind = from_factory("sparse:UHD4096,k=16,epochs=1,rescore=0")  # pure: score() == search
    assert kind.needs_training()
    batch = BuildBatch([str(i) for i in range(600)], [""] * 600, ["t"] * 600, x)
    write_docs(tmp_path, [Document(str(i), "", "t", {}) for i in range(600)], {}, x)  # for rescore
    kind.train(batch)
    assert kind.needs_training()  # trained, not yet saved
    (tmp_path / "art").mkdir()
    assert kind.save_artifacts(tmp_path / "art") and not kind.needs_training()
    info = kind.build(batch, tmp_path)
    assert info["n_rows"] == 600 and 0 < info["n_postings"] <= 600 * 16
    seg = kind.open(tmp_path, info, Segment(tmp_path, "s", 600))
    prepared = kind.prepare([Query(vector=v) for v in q], [seg], [None], {}, {})
    s, r = seg.search(prepared, 10, {}, None)
    assert s.shape == (5, 10) and (np.diff(s, axis=1) <= 0).all()
    assert np.allclose(seg.score(prepared, r[0])[0], s[0])
    exh = kind.prepare([Query(vector=v) for v in q], [seg], [None], {"prune": "0", "k": "8"}, {})
    s8, r8 = seg.search(exh, 10, {}, None)
    assert (np.diff(exh.ptr) <= 8).all() and exh.touched.sum() > 0
    resc = kind.prepare([Query(vector=v) for v in q], [seg], [None], {"rescore": "50"}, {})
    sr, rr = seg.search(resc, 10, {}, None)
    assert np.allclose(sr, np.take_along_axis(q @ x.T, rr, 1), atol=1e-5)
    other = from_factory("sparse:UHD8192,k=16")
    with pytest.raises(Corrupt):
        other.load_artifacts(tmp_path / "art")
    with pytest.raises(InvalidArgument):
        kind.prepare([Query(vector=v) for v in q], [seg], [None], {"bogus": "1"}, {})
    with pytest.raises(InvalidArgument):
        kind.prepare([Query(vector=np.ones(7, np.float32))], [seg], [None], {}, {})


def test_end_to_end_collection(tmp_path, corpus):
    eng = polyindex.open(tmp_path)
    coll = eng.create_collection("s", ["lexical", "dense", "sparse:UHD4096,k=16,epochs=2"])
    assert coll.query("anything", profile="sparse") == []  # no projector yet: no error
    filler = corpus.make(tmp_path / "filler.jsonl", 150, seed=1, dup_frac=0.0, words=12)
    coll.add(filler + DOCS[:3])  # the first segment trains the projector
    coll.add(DOCS[3:])
    assert {"sparse", "hybrid-sparse", "hybrid"} <= set(coll.profiles())
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["artifacts"]["sparse"] and (tmp_path / "s" / "artifacts" / "sparse").is_dir()
    hits = coll.query("chocolate cake with butter", profile="sparse", k=5)
    assert hits and len(hits) <= 5
    mixed = coll.query("chocolate cake with butter", profile="hybrid-sparse", k=5)
    assert mixed[0].id == "cake"
    # a document's own embedding finds it first (rescoring the sparse candidates exactly)
    vec = coll.encoder.encode(["Chess openings The Sicilian defence is a sharp reply to the "
                               "king pawn opening."])[0]
    top = coll.query(vector=vec, k=1, profile={"retrieve": [
        {"index": "sparse", "k": 1, "params": "rescore=20"}]})
    assert top[0].id == "chess"
    # reopened: the projector comes back from the artifacts, results are identical
    again = polyindex.open(tmp_path, readonly=True).collection("s")
    assert [h.id for h in again.query("chocolate cake with butter", profile="sparse", k=5)] == \
        [h.id for h in hits]


def test_online_writes_train_then_save_the_projector(tmp_path):
    """A buffer segment built before any seal trains the projector; the seal saves that same
    projector, so buffered and sealed results agree and survive a reopen."""
    polyindex.open(tmp_path).create_collection("o", ["dense", "sparse:UHD4096,k=16,epochs=1"])
    eng = polyindex.open(tmp_path, online=True)
    coll = eng.collection("o")
    docs = [{"_id": f"d{i}", "title": "", "text": f"note {i} on subject {i % 7}"} for i in range(40)]
    coll.add(docs[:25])
    before = [h.id for h in coll.query("subject 3", profile="sparse", k=5)]
    coll.add(docs[25:])
    coll.seal()
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["artifacts"]["sparse"]
    after = [h.id for h in coll.query("subject 3", profile="sparse", k=5)]
    eng.close()
    again = [h.id for h in polyindex.open(tmp_path).collection("o").query(
        "subject 3", profile="sparse", k=5)]
    assert before and after == again
