"""The multivector kind: numba kernels vs numpy references, codebook determinism, the kind's
search/score against exact MaxSim over its decoded tokens, pruning, pure-code storage, factory
strings, and a collection (real model) that survives a reopen with identical scores."""
import numpy as np
import pytest

import polyindex
from polyindex import Corrupt, InvalidArgument
from polyindex.index.multivector import codec
from polyindex.index.multivector import kernels as mk
from polyindex.index.multivector.kind import MultivectorKind, _keep_top
from polyindex.index.protocol import BuildBatch, DocTokens, Query
from polyindex.index.registry import from_factory
from polyindex.index.postings import half_lut


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered_tokens(n_docs, d=32, seed=0, lo=3, hi=40, topics=12):
    """Documents whose tokens cluster around a few topic directions (like real tokens)."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((topics, d)))
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(lo, hi))
        t = centres[rng.integers(topics, size=n)] + 0.35 * rng.standard_normal((n, d))
        special = np.zeros(n, bool)
        special[0] = True
        docs.append(DocTokens(unit(t).astype(np.float16), special,
                              rng.random(n).astype(np.float32),
                              rng.integers(0, 50, size=n).astype(np.int32)))
    return docs


def csr(lengths, k, seed):
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    codes = rng.integers(0, k, size=int(offsets[-1])).astype(np.uint16)
    return offsets, codes


def ref_maxsim(sim_rows, offsets, cand):
    """sum_t max over a document's tokens of sim_rows[token, t]; 0 for an empty document."""
    out = []
    for r in cand:
        s, e = offsets[r], offsets[r + 1]
        out.append(0.0 if e == s else sim_rows[s:e].max(0).sum())
    return np.array(out, np.float32)


# ---------------------------------------------------------------------------- kernels

def test_first_pass_lut_matches_numpy():
    rng = np.random.default_rng(1)
    k, nqt = 300, 7
    lengths = rng.integers(0, 30, size=500)
    lengths[[3, 77]] = 0  # empty documents score 0
    offsets, codes = csr(lengths, k, 2)
    lut_t = rng.standard_normal((k, nqt)).astype(np.float32)
    cand = rng.permutation(500)[:350].astype(np.int64)
    out = np.empty(len(cand), np.float32)
    mk.first_pass_lut(lut_t, offsets, codes, cand, out)
    ref = ref_maxsim(lut_t[codes], offsets, cand)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_first_pass_hamming_matches_numpy():
    rng = np.random.default_rng(3)
    k, nqt, bits = 200, 5, 48
    lengths = rng.integers(0, 25, size=300)
    offsets, codes = csr(lengths, k, 4)
    mask = np.uint64((1 << bits) - 1)
    csig = rng.integers(0, 2**63, size=k, dtype=np.uint64) & mask
    qsig = rng.integers(0, 2**63, size=nqt, dtype=np.uint64) & mask
    cand = np.arange(300, dtype=np.int64)
    out = np.empty(len(cand), np.float32)
    mk.first_pass_hamming(qsig, csig, bits, offsets, codes, cand, out)
    pop = np.array([[bin(int(q) ^ int(c)).count("1") for q in qsig] for c in csig])
    sim = (bits - 2 * pop) / bits  # (k, nqt)
    ref = ref_maxsim(sim[codes], offsets, cand)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nq", [6, 21])  # the register path; two WIDE chunks, zero-padded
@pytest.mark.parametrize("opq,opq_dim", [(False, 0), (True, 0), (True, 24)])
def test_final_pass_matches_decoded_exact_maxsim(opq, opq_dim, nq):
    d, m = 32, 8
    docs = clustered_tokens(120, d=d, seed=5)
    x = np.concatenate([t.vectors for t in docs]).astype(np.float32)
    cb = codec.train(x, 16, m, seed=0, opq=opq, opq_dim=opq_dim)
    if opq:  # orthonormal rows (a rotation, reducing to opq_dim), and not the identity
        out_dim = opq_dim or d
        assert cb.rotation.shape == (out_dim, d) and cb.pq_centroids.shape[2] == out_dim // m
        np.testing.assert_allclose(cb.rotation @ cb.rotation.T, np.eye(out_dim), atol=1e-4)
        assert not np.allclose(cb.rotation[:, :out_dim], np.eye(out_dim), atol=1e-2)
    codes = cb.assign(x)
    res = cb.residual_codes(x, codes)
    offsets = np.concatenate([[0], np.cumsum([len(t.vectors) for t in docs])]).astype(np.int32)
    q = unit(np.random.default_rng(6).standard_normal((nq, d)))
    cand = np.arange(len(docs), dtype=np.int64)[::-1].copy()
    out = np.empty(len(cand), np.float32)
    half = half_lut()
    mk.final_pass_pq(cb.lut(q), cb.pq_tables(q), offsets, codes.astype(np.uint16), res,
                     np.zeros(0, np.uint16), half, cand, out)
    decoded = cb.decode(codes, res)  # plain numpy: centroid + PQ sub-centroids, then dot
    ref = ref_maxsim(decoded @ q.T, offsets, cand)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    # with the stored float16 scales: MaxSim over the decoded tokens times their scale, which
    # is |x| / (|x_hat| cos(x, x_hat) ** PARALLEL)
    sc = cb.scales(x, codes, res)
    mk.final_pass_pq(cb.lut(q), cb.pq_tables(q), offsets, codes.astype(np.uint16), res,
                     sc.view(np.uint16), half, cand, out)
    scaled = decoded * sc.astype(np.float32)[:, None]
    cos = (x * decoded).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(decoded, axis=1)
    np.testing.assert_allclose(
        np.linalg.norm(scaled, axis=1) * np.maximum(cos, 0.5) ** codec.PARALLEL,
        np.linalg.norm(x, axis=1), rtol=2e-3)
    np.testing.assert_allclose(out, ref_maxsim(scaled @ q.T, offsets, cand), rtol=1e-4, atol=1e-4)
    # the decoded tokens are close to the originals (the residual carries real information)
    err_codes = np.linalg.norm(x - cb.centroids[codes], axis=1).mean()
    err_res = np.linalg.norm(x - decoded, axis=1).mean()
    assert err_res < 0.8 * err_codes


def test_gather_candidates_matches_numpy():
    rng = np.random.default_rng(7)
    n_rows, k = 400, 50
    lengths = rng.integers(0, 5, size=k)
    ivf_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ivf_docs = np.concatenate([np.sort(rng.choice(n_rows, size=n, replace=False))
                               for n in lengths]).astype(np.int32)
    probes = np.array([3, 9, 10, 41], np.int64)
    allow = rng.random(n_rows) < 0.6
    mark = np.zeros(n_rows, np.uint8)
    out = np.empty(n_rows, np.int64)
    for use in (False, True):
        n = mk.gather_candidates(ivf_off, ivf_docs, probes, allow, use, mark, out)
        ref = set()
        for c in probes:
            ref |= set(ivf_docs[ivf_off[c]:ivf_off[c + 1]].tolist())
        if use:
            ref = {r for r in ref if allow[r]}
        assert sorted(out[:n].tolist()) == sorted(ref) and n == len(ref)
        assert not mark.any()


# ---------------------------------------------------------------------------- codebook

def test_codebook_training_is_deterministic_for_a_seed():
    x = np.concatenate([t.vectors for t in clustered_tokens(150, seed=8)]).astype(np.float32)
    a = codec.train(x, 32, 8, seed=3, bits=16, opq=True)
    b = codec.train(x, 32, 8, seed=3, bits=16, opq=True)
    c = codec.train(x, 32, 8, seed=4, bits=16, opq=True)
    assert np.array_equal(a.centroids, b.centroids)
    assert np.array_equal(a.pq_centroids, b.pq_centroids)
    assert np.array_equal(a.rotation, b.rotation)
    assert np.array_equal(a.signatures, b.signatures)
    assert not np.array_equal(a.centroids, c.centroids)


def test_codebook_save_load_roundtrip(tmp_path):
    x = np.concatenate([t.vectors for t in clustered_tokens(80, seed=9)]).astype(np.float32)
    a = codec.train(x, 16, 4, seed=0, bits=8, opq=True)
    a.save(tmp_path)
    b = codec.Codebook.load(tmp_path)
    assert np.array_equal(a.centroids, b.centroids) and np.array_equal(a.signatures, b.signatures)
    assert np.array_equal(a.rotation, b.rotation)
    assert np.array_equal(a.residual_codes(x, a.assign(x)), b.residual_codes(x, b.assign(x)))


# ---------------------------------------------------------------------------- the kind

def built(tmp_path, body, docs, name="seg"):
    kind = from_factory(f"multivector:{body}")
    n = len(docs)
    batch = BuildBatch([str(i) for i in range(n)], [""] * n, [""] * n, None, docs)
    kind.train(batch)
    folder = tmp_path / name
    folder.mkdir()
    info = kind.build(batch, folder)
    return kind, kind.open(folder, info), info


def queries(n, d=32, seed=11):
    rng = np.random.default_rng(seed)
    return [Query(extra={"tokens": unit(rng.standard_normal((int(rng.integers(2, 8)), d)))})
            for _ in range(n)]


def decoded_reference(kind, seg, q):
    """Exact MaxSim of q over the segment's decoded tokens (numpy)."""
    cb = kind.codebook
    x = cb.decode(seg.codes.astype(np.int64), seg.res)
    if len(seg.scale):  # decoded tokens times their stored float16 scale
        x = x * seg.scale.view(np.float16).astype(np.float32)[:, None]
    return ref_maxsim(x @ q.T, seg.offsets, np.arange(seg.n_rows))


def test_search_and_score_equal_maxsim_over_decoded_tokens(tmp_path):
    docs = clustered_tokens(200, seed=12)
    kind, seg, info = built(tmp_path, "KMeans32,residual=OPQ8", docs)
    assert kind.codebook.rotation is not None
    assert info["tokens_in"] == sum(len(t.vectors) - 1 for t in docs)  # [CLS]-like dropped
    qs = queries(4)
    prep = kind.prepare(qs, [seg], [None], {"exhaustive": "1", "ndocs": "1000"}, {})
    scores, rows = seg.search(prep, 10, {}, None)
    for qi, q in enumerate(qs):
        ref = decoded_reference(kind, seg, q.extra["tokens"])
        top = np.lexsort((np.arange(len(ref)), -ref))[:10]
        assert rows[qi].tolist() == top.tolist()
        np.testing.assert_allclose(scores[qi], ref[top], rtol=1e-4, atol=1e-4)
    # score() of arbitrary rows (rerank mode), out-of-range rows are NaN
    ask = np.array([5, 0, 199, -1, 200, 5])
    got = seg.score(prep, ask)
    for qi, q in enumerate(qs):
        ref = decoded_reference(kind, seg, q.extra["tokens"])
        np.testing.assert_allclose(got[qi, [0, 1, 2, 5]], ref[[5, 0, 199, 5]], rtol=1e-4, atol=1e-4)
        assert np.isnan(got[qi, [3, 4]]).all()


def test_end_to_end_uses_inverted_lists_only(tmp_path):
    docs = clustered_tokens(300, seed=13)
    kind, seg, _ = built(tmp_path, "KMeans64,residual=PQ8", docs)
    qs = queries(3, seed=14)
    prep = kind.prepare(qs, [seg], [None], {"nprobe": "1"}, {})
    scores, rows = seg.search(prep, 5, {}, None)
    for qi, q in enumerate(prep.queries):  # every hit has a token under a probed centroid
        for r in rows[qi][rows[qi] >= 0]:
            doc_codes = set(seg.codes[seg.offsets[r]:seg.offsets[r + 1]].tolist())
            assert doc_codes & set(q.probes.tolist())
    # one query token, one probe: the candidates are exactly that centroid's inverted list
    one = [Query(extra={"tokens": unit(np.random.default_rng(20).standard_normal((1, 32)))})]
    prep = kind.prepare(one, [seg], [None], {"nprobe": "1"}, {})
    c = prep.queries[0].probes[0]
    listed = seg.ivf_docs[seg.ivf_offsets[c]:seg.ivf_offsets[c + 1]]
    _, rows1 = seg.search(prep, 1000, {}, None)
    assert prep.stats["candidates"] == len(listed) < seg.n_rows  # not a scan of every row
    assert sorted(rows1[0][rows1[0] >= 0].tolist()) == sorted(listed.tolist())
    # the allow mask is honoured
    allow = np.zeros(seg.n_rows, bool)
    allow[::3] = True
    prep = kind.prepare(qs, [seg], [None], {"exhaustive": "1"}, {})
    _, rows = seg.search(prep, 20, {}, allow)
    assert (rows[rows >= 0] % 3 == 0).all() and (rows >= 0).sum() == 60


def test_binary_first_pass_and_pruning(tmp_path):
    docs = clustered_tokens(150, seed=15)
    kind, seg, info = built(tmp_path, "KMeans32,residual=PQ8,prune=0.5,binary=32", docs)
    assert info["salience"] == "attention"
    lengths = np.array([len(t.vectors) - 1 for t in docs])
    assert info["tokens_kept"] == int(np.maximum(1, np.ceil(0.5 * lengths)).sum())
    assert 0.45 < info["kept_fraction"] < 0.6
    prep = kind.prepare(queries(2), [seg], [None], {"ndocs": "10"}, {})
    assert prep.queries[0].qsig is not None
    scores, rows = seg.search(prep, 5, {}, None)
    assert (rows >= 0).all() and (np.diff(scores, axis=1) <= 1e-6).all()
    # the kept tokens are the most salient ones of each document
    sal = np.concatenate([t.salience[1:] for t in docs])
    keep = _keep_top(sal, lengths, 0.5)
    first = keep[:lengths[0]]
    assert sal[:lengths[0]][first].min() >= sal[:lengths[0]][~first].max()
    # IDF fallbacks: token ids, then codes
    no_att = [DocTokens(t.vectors, t.special, None, t.token_ids) for t in docs]
    _, _, info2 = built(tmp_path, "KMeans32,residual=PQ8,prune=0.5", no_att, "idf")
    no_ids = [DocTokens(t.vectors, t.special) for t in docs]
    _, _, info3 = built(tmp_path, "KMeans32,residual=PQ8,prune=0.5", no_ids, "code")
    assert (info2["salience"], info3["salience"]) == ("idf-token", "idf-code")


def test_pure_code_mode_storage_and_scores(tmp_path):
    docs = clustered_tokens(200, seed=16, lo=60, hi=120)
    kind, seg, info = built(tmp_path, "KMeans256,residual=none", docs)
    assert seg.res is None and seg.codes.dtype == np.uint8
    stored = info["bytes"]["multivector.tokens.arrow"] + info["bytes"]["multivector.docs.arrow"]
    assert info["tokens_stored"] < info["tokens_in"]  # duplicates within a document dropped
    assert stored / info["tokens_stored"] <= 1.1, stored / info["tokens_stored"]
    # deduplicated codes score exactly like the full code sequence
    qs = queries(2, seed=17)
    prep = kind.prepare(qs, [seg], [None], {}, {})
    got = seg.score(prep, np.arange(seg.n_rows))
    x = np.concatenate([t.vectors[1:] for t in docs]).astype(np.float32)
    codes = kind.codebook.assign(x)
    off = np.concatenate([[0], np.cumsum([len(t.vectors) - 1 for t in docs])])
    for qi, q in enumerate(qs):
        lut = q.extra["tokens"] @ kind.codebook.centroids.T
        ref = ref_maxsim(lut.T[codes], off, np.arange(len(docs)))
        np.testing.assert_allclose(got[qi], ref, rtol=1e-5, atol=1e-5)


def test_format_1_segments_are_still_read(tmp_path):
    """Segments written before the docs file (format 1: list columns with int32 offsets in the
    tokens file) open and score exactly like their format-2 rewrite."""
    import pyarrow as pa

    from polyindex.index.multivector import files as mv
    docs = clustered_tokens(120, seed=23)
    kind, seg, info = built(tmp_path, "KMeans32,residual=PQ8", docs)
    old = tmp_path / "v1"
    old.mkdir()
    off = pa.array(seg.offsets.astype(np.int32))
    res = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(seg.res),
                                               [None, pa.py_buffer(seg.res.copy())])
    mv._write(old / mv.TOKENS_FILE, {
        "codes": pa.ListArray.from_arrays(off, pa.array(seg.codes, pa.uint16())),
        "residual": pa.ListArray.from_arrays(off, res),
        "scale": pa.ListArray.from_arrays(off, pa.array(seg.scale.view(np.float16)))})
    (old / mv.IVF_FILE).write_bytes((tmp_path / "seg" / mv.IVF_FILE).read_bytes())
    v1 = kind.open(old, {**info, "format": 1})
    prep = kind.prepare(queries(3), [seg], [None], {}, {})
    np.testing.assert_array_equal(v1.score(prep, np.arange(120)), seg.score(prep, np.arange(120)))
    with pytest.raises(Corrupt, match="newer"):
        kind.open(old, {**info, "format": mv.FORMAT + 1})


def test_factory_strings():
    assert MultivectorKind("").describe() == "multivector:KMeans4096,residual=OPQ32"
    assert MultivectorKind("residual=pq32").describe() == "multivector:KMeans4096,residual=PQ32"
    assert MultivectorKind("residual=OPQ40_320").describe() == \
        "multivector:KMeans4096,residual=OPQ40_320"
    k = from_factory("multivector:KMeans256,residual=none,prune=0.5,binary,special=keep")
    assert k.describe() == "multivector:KMeans256,residual=none,prune=0.5,binary,special=keep"
    assert from_factory(k.describe()).describe() == k.describe()
    for bad in ("multivector:Kmeans", "multivector:residual=RQ4", "multivector:residual=OPQ",
                "multivector:residual=PQ8_4", "multivector:residual=OPQ8_x", "multivector:prune=0",
                "multivector:prune=1.5", "multivector:special=maybe", "multivector:colour=red",
                "multivector:KMeans1", "multivector:nprobe=x"):
        with pytest.raises(InvalidArgument):
            from_factory(bad)
    kind = MultivectorKind("")
    with pytest.raises(InvalidArgument, match="unknown search parameter"):
        kind.prepare([Query(text="x")], [], [None], {"efSearch": "3"}, {})


def test_codebook_mismatch_is_corrupt(tmp_path):
    x = np.concatenate([t.vectors for t in clustered_tokens(60, seed=18)]).astype(np.float32)
    codec.train(x, 16, 4, seed=0).save(tmp_path)
    with pytest.raises(Corrupt):
        MultivectorKind("KMeans16,residual=PQ8").load_artifacts(tmp_path)
    with pytest.raises(Corrupt, match="residual PQ4"):  # no rotation in a PQ codebook
        MultivectorKind("KMeans16,residual=OPQ4").load_artifacts(tmp_path)
    MultivectorKind("KMeans16,residual=PQ4").load_artifacts(tmp_path)


# ---------------------------------------------------------------------------- collection

WORDS = ("boundary layer flow wing supersonic heat transfer shock wave pressure cylinder "
         "turbulent laminar plate nozzle jet vortex drag lift panel flutter").split()


def test_collection_with_multivector_survives_reopen(tmp_path):
    rng = np.random.default_rng(19)
    docs = [{"_id": f"d{i}", "title": f"t{i}", "text": " ".join(rng.choice(WORDS, 25))}
            for i in range(60)]
    eng = polyindex.open(tmp_path)
    coll = eng.create_collection("c", ["lexical", "dense", "multivector:KMeans32,residual=OPQ8"])
    coll.add(docs)
    assert "hybrid-mv" in coll.profiles() and "multivector" in coll.profiles()
    text = "supersonic shock wave over a wing"
    before = coll.query(text, k=10, profile="multivector")
    fused = coll.query(text, k=10, profile="hybrid-mv")
    assert len(before) == 10 and len(fused) == 10
    # the dense embedding came from the same forward pass and equals the plain encoder's
    snap = coll.view()
    stored = snap.segments[0].indexes["dense"].matrix()  # stored once: the Flat index's
    plain = coll.encoder.encode([f"{d['title']} {d['text']}" for d in docs])
    np.testing.assert_allclose(stored, plain, atol=1e-6)
    reopened = polyindex.open(tmp_path, readonly=True).collection("c")
    after = reopened.query(text, k=10, profile="multivector")
    assert [(h.id, h.score) for h in after] == [(h.id, h.score) for h in before]
    # score() of the hits (rerank mode) gives the search scores back
    kind = reopened.kinds["multivector"]
    snap = reopened.view()
    seg = snap.segments[0].indexes["multivector"]
    prep = kind.prepare([Query(text=text)], [seg], [None], {}, {})
    rows = snap.segments[0].docs.rows_of([h.id for h in after])
    np.testing.assert_allclose(seg.score(prep, rows)[0], [h.score for h in after], rtol=1e-6)


def test_online_buffer_segments_encode_their_own_tokens(tmp_path):
    rng = np.random.default_rng(21)
    docs = [{"id": f"o{i}", "text": " ".join(rng.choice(WORDS, 20))} for i in range(40)]
    eng = polyindex.open(tmp_path, online=True)
    try:
        coll = eng.create_collection("o", ["lexical", "multivector:KMeans16,residual=PQ8"])
        coll.add(docs)  # a buffer segment: no writer tokens, the kind encodes the texts
        text = "laminar boundary layer on a flat plate"
        buffered = coll.query(text, k=5, profile="multivector")
        coll.seal()
        sealed = coll.query(text, k=5, profile="multivector")
        assert [h.id for h in sealed] == [h.id for h in buffered]
        np.testing.assert_allclose([h.score for h in sealed], [h.score for h in buffered],
                                   rtol=1e-5)
        assert coll.table.artifacts().get("multivector")  # the fallback codebook was committed
    finally:
        eng.close()
