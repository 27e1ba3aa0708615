"""Batched multivector search (issue 39 part 2): many queries per kernel call. The batched
numba kernels give each query's scores bit for bit as its own call; a batch through the kind
(several segments, a collection-wide ndocs) gives every query the hits it gets alone; the
torch twin (``POLYINDEX_KERNELS=torch``: the cuda placement's code path, on the CPU) matches
within float tolerance."""
import numpy as np
import pytest

from polyindex.index.multivector import kernels as mk
from polyindex.index.postings import half_lut
from polyindex.index.protocol import BuildBatch
from polyindex.index.registry import from_factory

from test_multivector import clustered_tokens, queries

HALF = half_lut()


def test_batch_kernels_equal_one_query_calls():
    rng = np.random.default_rng(5)
    k, m, n = 64, 8, 300
    lens = rng.integers(0, 20, n)
    lens[:2] = 0
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    codes = rng.integers(0, k, int(off[-1])).astype(np.uint16)
    res = rng.integers(0, 256, (int(off[-1]), m)).astype(np.uint8)
    scale = rng.uniform(0.8, 1.2, int(off[-1])).astype(np.float16).view(np.uint16)
    nqts = [3, 7, 1, 5, 12, 28]  # register paths, and WIDE chunks (one, two)
    luts = [rng.standard_normal((k, t)).astype(np.float32) for t in nqts]
    pqs = [0.1 * rng.standard_normal((m, 256, t)).astype(np.float32) for t in nqts]
    T = max(nqts)
    L = np.zeros((len(nqts), k, T), np.float32)
    P = np.zeros((len(nqts), m, 256, T), np.float32)
    for i, t in enumerate(nqts):
        L[i, :, :t], P[i, ..., :t] = luts[i], pqs[i]
    cands = [rng.choice(n, size=s, replace=False).astype(np.int64)
             for s in (50, 120, 1, 80, 60, 90)]
    cand, qid = np.concatenate(cands), np.repeat(np.arange(len(cands)), [len(c) for c in cands])
    first, final = np.empty(len(cand), np.float32), np.empty(len(cand), np.float32)
    mk.first_pass_lut_batch(L, np.array(nqts, np.int64), qid, off, codes, cand, first)
    mk.final_pass_pq_batch(L, P, np.array(nqts, np.int64), qid, off, codes, res, scale, HALF,
                           cand, final)
    at = 0
    for i, c in enumerate(cands):
        one_first, one_final = np.empty(len(c), np.float32), np.empty(len(c), np.float32)
        mk.first_pass_lut(luts[i], off, codes, c, one_first)
        mk.final_pass_pq(luts[i], pqs[i], off, codes, res, scale, HALF, c, one_final)
        assert np.array_equal(first[at:at + len(c)], one_first)
        assert np.array_equal(final[at:at + len(c)], one_final)
        at += len(c)


def segments(tmp_path, body, parts):
    kind = from_factory(f"multivector:{body}")
    docs = [d for p in parts for d in p]
    kind.train(BuildBatch([str(i) for i in range(len(docs))], [""] * len(docs),
                          [""] * len(docs), None, docs))
    segs = []
    for j, p in enumerate(parts):
        folder = tmp_path / f"seg{j}"
        folder.mkdir()
        batch = BuildBatch([str(i) for i in range(len(p))], [""] * len(p), [""] * len(p), None, p)
        segs.append(kind.open(folder, kind.build(batch, folder)))
    bases = np.concatenate([[0], np.cumsum([s.n_rows for s in segs])[:-1]]).astype(np.int64)
    return kind, segs, bases


@pytest.mark.parametrize("body", ["KMeans32,residual=OPQ8,ndocs=20",
                                  "KMeans32,residual=OPQ8,ncandidates=40,tcs=0.2,ndocs=20",
                                  "KMeans32,residual=none,ndocs=20",
                                  "KMeans32,residual=PQ8,binary=32,ndocs=20"])
@pytest.mark.parametrize("kernels", ["numba", "torch"])
def test_a_batch_gets_what_each_query_gets_alone(tmp_path, setting, body, kernels):
    if kernels == "torch":
        setting("POLYINDEX_KERNELS", "torch")
    kind, segs, bases = segments(tmp_path, body, [clustered_tokens(90, seed=1),
                                                  clustered_tokens(70, seed=2)])
    qs = queries(9)
    qs[4].extra["tokens"] = qs[4].extra["tokens"][:0]  # a query without tokens: no hits
    allow = [None, None]
    prep = kind.prepare(qs, segs, [None, None], {}, {})
    s, r = kind.search_snapshot(prep, segs, bases, 10, {}, allow)
    assert prep.stats["final"] < prep.stats["candidates"] or "none" in body
    assert (r[4] == -1).all()
    for i, q in enumerate(qs):
        one = kind.prepare([q], segs, [None, None], {}, {})
        s1, r1 = kind.search_snapshot(one, segs, bases, 10, {}, allow)
        assert r1[0].tolist() == r[i].tolist(), i
        np.testing.assert_allclose(s1[0], s[i], rtol=1e-5)
    if kernels == "torch":  # the torch twin against the numba kernels, the same batch
        setting("POLYINDEX_KERNELS", None)
        prep = kind.prepare(qs, segs, [None, None], {}, {})
        s2, r2 = kind.search_snapshot(prep, segs, bases, 10, {}, allow)
        assert r2.tolist() == r.tolist()
        np.testing.assert_allclose(s2, s, rtol=1e-4, atol=1e-5)
