"""PLAID-style multivector search (issue 39 part 2, third pass): the pruned centroid
interaction (``first_pass_pruned_batch``) is the first pass over a table whose pruned
centroids' rows are zero, bit for bit, alone or batched, on one thread or the pool; its torch
twin agrees; the depths (``ncandidates``, ``tcs``, ``ndocs``) are collection-wide cuts, so the
same documents in one segment or in several give the same top 10."""
import numpy as np
import pytest

from polyindex import InvalidArgument
from polyindex.index.multivector import kernels as mk
from polyindex.index.protocol import Query
from polyindex.index.postings import half_lut
from polyindex.index.registry import from_factory

from test_multivector import clustered_tokens, queries
from test_multivector_batch import segments


def corpus(rng, k=64, n=400):
    lens = rng.integers(0, 30, n)
    lens[:3] = 0
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return off, rng.integers(0, k, int(off[-1])).astype(np.uint16)


def test_pruned_pass_is_the_first_pass_over_a_zeroed_table(monkeypatch):
    rng = np.random.default_rng(3)
    k = 64
    off, codes = corpus(rng, k)
    nqts = [4, 9, 1]
    T = max(nqts)
    L = np.zeros((len(nqts), k, T), np.float32)
    for i, t in enumerate(nqts):
        L[i, :, :t] = rng.uniform(-0.3, 0.9, (k, t))
    kept = (L.max(2) >= 0.6).astype(np.uint8)
    assert 0 < kept.mean() < 1
    cands = [rng.choice(400, size=s, replace=False).astype(np.int64) for s in (300, 50, 7)]
    cand, qid = np.concatenate(cands), np.repeat(np.arange(3), [len(c) for c in cands])
    nqt = np.array(nqts, np.int64)
    got = np.empty(len(cand), np.float32)
    mk.first_pass_pruned_batch(L, kept, nqt, qid, off, codes, cand, got)
    ref = np.empty(len(cand), np.float32)
    mk.first_pass_lut_batch(L * kept[..., None], nqt, qid, off, codes, cand, ref)
    assert np.array_equal(got, ref)
    assert not np.array_equal(got[qid == 0], np.zeros((qid == 0).sum()))
    at = 0  # one query per call: the same bits as its slice of the batch
    for i, c in enumerate(cands):
        one = np.empty(len(c), np.float32)
        mk.first_pass_pruned_batch(L[i:i + 1, :, :nqts[i]], kept[i:i + 1], nqt[i:i + 1],
                                   np.zeros(len(c), np.int64), off, codes, c, one)
        assert np.array_equal(one, got[at:at + len(c)])
        at += len(c)
    # the calling thread alone (a query's few candidates) or the pool: the same bits
    for low in (0, 10**9):
        monkeypatch.setattr(mk, "PARALLEL_MIN", low)
        with mk.threads_for(len(cand)):
            again = np.empty(len(cand), np.float32)
            mk.first_pass_pruned_batch(L, kept, nqt, qid, off, codes, cand, again)
        assert np.array_equal(again, got)


def test_torch_twin_of_the_pruned_pass():
    pytest.importorskip("torch")
    from polyindex.cuda.multivector import Kernels
    from polyindex.index.postings import half_lut
    rng = np.random.default_rng(4)
    k = 64
    off, codes = corpus(rng, k)
    L = rng.uniform(-0.3, 0.9, (2, k, 6)).astype(np.float32)
    kept = (L.max(2) >= 0.6).astype(np.uint8)
    cand = np.arange(400, dtype=np.int64)
    qid = (cand % 2).astype(np.int64)
    nqt = np.array([6, 6], np.int64)
    want, got = np.empty(400, np.float32), np.empty(400, np.float32)
    mk.first_pass_pruned_batch(L, kept, nqt, qid, off, codes, cand, want)
    Kernels("cpu", half_lut()).first_pass_pruned_batch(L, kept, nqt, qid, off, codes, cand, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


BODY = "KMeans32,residual=OPQ8,ncandidates=40,tcs=0.2,ndocs=12"


@pytest.mark.parametrize("kernels", ["numba", "torch"])
def test_one_segment_or_several_give_the_same_top_10(tmp_path, setting, kernels):
    if kernels == "torch":
        setting("POLYINDEX_KERNELS", "torch")
    docs = clustered_tokens(240, seed=7)
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    one = segments(tmp_path / "one", BODY, [docs])
    many = segments(tmp_path / "many", BODY, [docs[:50], docs[50:170], docs[170:]])
    qs = queries(12)
    out = []
    for kind, segs, bases in (one, many):
        prep = kind.prepare(qs, segs, [None] * len(segs), {}, {})
        s, keys = kind.search_snapshot(prep, segs, bases, 10, {}, [None] * len(segs))
        # every stage ran: the pruned pass cut 240 candidates to 40, the first pass to 12
        assert prep.stats["final"] == 12 * len(qs) < prep.stats["candidates"]
        out.append((s, keys))
    assert out[0][1].tolist() == out[1][1].tolist()
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-6)
    # the pruning changes what survives: no pruned pass (ncandidates=0) ranks differently
    # somewhere, else this test would not exercise it
    kind, segs, bases = one
    prep = kind.prepare(qs, segs, [None], {"ncandidates": "0"}, {})
    _, plain = kind.search_snapshot(prep, segs, bases, 10, {}, [None])
    assert plain.tolist() != out[0][1].tolist()


def test_final_tokens_cuts_a_long_querys_final_pass(tmp_path):
    """``final_tokens``: a query over that many tokens sends ceil(ndocs * final_tokens / its
    tokens) documents to the final pass, a shorter one ndocs; 0 (the default) sends ndocs.
    The top k is the final pass's over those: the same as without the cut wherever the cut
    keeps the uncut top k."""
    from polyindex.index.multivector.segment import MVPrepared
    kind, segs, bases = segments(tmp_path, BODY, [clustered_tokens(240, seed=7)])
    rng = np.random.default_rng(12)
    long_q = Query(extra={"tokens": rng.standard_normal((20, 32)).astype(np.float32)})
    qs = queries(2) + [long_q]
    short = sum(len(q.extra["tokens"]) <= 8 for q in qs)
    assert short == 2
    finals = {}
    for ft in ("0", "8"):
        prep = kind.prepare(qs, segs, [None], {"final_tokens": ft}, {})
        s, keys = kind.search_snapshot(prep, segs, bases, 3, {}, [None])
        finals[ft] = (prep.stats["final"], keys)
    assert finals["0"][0] == 12 * 3
    assert finals["8"][0] == 12 * 2 + 5  # ceil(12 * 8 / 20)
    assert finals["8"][1][:2].tolist() == finals["0"][1][:2].tolist()  # short queries: no cut
    assert MVPrepared([], 4, 256, False, final_tokens=8).final_docs(33) == 63
    assert MVPrepared([], 4, 256, False, final_tokens=8).final_docs(8) == 256
    assert MVPrepared([], 4, 256, False).final_docs(100) == 256
    with pytest.raises(InvalidArgument, match="final_tokens"):
        kind.prepare(qs, segs, [None], {"final_tokens": "-1"}, {})


def test_probe_tables_are_the_top_probes_the_transpose_and_the_maxima(tmp_path):
    """``kernels.probe_tables``: each token's ``nprobe`` best centroids (a tie: the lower id),
    once each, ascending; the transposed table; each centroid's best score. A query probing
    at least every centroid probes every centroid."""
    rng = np.random.default_rng(8)
    lut = rng.standard_normal((7, 300)).astype(np.float32)
    lut[3, 10] = lut[3, 11] = lut[3].max() + 1  # a tie at the top of token 3
    lut_t, best = np.empty((300, 7), np.float32), np.empty(300, np.float32)
    for nprobe in (1, 4, 299):
        probes = mk.probe_tables(lut, nprobe, lut_t, best)
        want = np.unique(np.argsort(-lut, axis=1, kind="stable")[:, :nprobe])
        assert probes.tolist() == want.tolist()
        assert np.array_equal(lut_t, lut.T) and np.array_equal(best, lut.max(0))
    one_t = np.empty((300, 1), np.float32)
    assert mk.probe_tables(lut[3:4], 1, one_t, best).tolist() == [10]  # the tie's lower id
    assert len(mk.probe_tables(lut, 0, lut_t, best)) == 0
    kind, _, _ = segments(tmp_path, BODY, [clustered_tokens(60, seed=2)])
    q = queries(1)[0].extra["tokens"]
    assert kind._tables([q], kind.codebook.k + 5, 0.2, 0)[0].probes.tolist() \
        == list(range(kind.codebook.k))


def test_depths_in_the_factory_string_and_search_params(tmp_path):
    kind = from_factory("multivector:KMeans32,ncandidates=100,tcs=0.3,ndocs=16")
    assert (kind.ncandidates, kind.tcs, kind.ndocs) == (100, 0.3, 16)
    assert "ncandidates=100" in kind.describe() and "tcs=0.3" in kind.describe()
    assert from_factory(f"multivector:{kind.describe().split(':', 1)[1]}").describe() \
        == kind.describe()
    default = from_factory("multivector")
    assert (default.ncandidates, default.tcs, default.ndocs) == (2048, 0.45, 256)
    assert "tcs" not in default.describe()
    for bad in ("ncandidates=-1", "tcs=abc", "tcs=inf"):
        with pytest.raises(InvalidArgument, match="ncandidates|tcs"):
            from_factory(f"multivector:KMeans32,{bad}")
    kind, segs, bases = segments(tmp_path, "KMeans32,residual=PQ8", [clustered_tokens(40)])
    for params in ({"tcs": "x"}, {"ncandidates": "-2"}):
        with pytest.raises(InvalidArgument, match="ncandidates"):
            kind.prepare(queries(1), segs, [None], params, {})


def test_final_pass_register_columns(monkeypatch):
    """The final pass keeps a short query's columns in registers (``REGISTER_COLUMNS``) and
    loops over a long one's: both are the decoded tokens' MaxSim (numpy reference); a query's
    own narrow tables and a batch's wider stack give the same bits (the register path reads
    only the query's columns); one thread or the pool, the same bits; the torch twin agrees."""
    rng = np.random.default_rng(8)
    k, m = 64, 8
    off, codes = corpus(rng, k)
    res = rng.integers(0, 256, (int(off[-1]), m)).astype(np.uint8)
    scale = rng.uniform(0.8, 1.25, int(off[-1])).astype(np.float16).view(np.uint16)
    half = half_lut()
    nqts = [1, 3, 8, 9, 13, 6]  # both sides of REGISTER_COLUMNS = 8
    assert min(nqts) <= mk.REGISTER_COLUMNS < max(nqts)
    luts = [rng.uniform(-0.3, 0.9, (k, t)).astype(np.float32) for t in nqts]
    pqs = [rng.normal(0, 0.05, (m, 256, t)).astype(np.float32) for t in nqts]
    T = max(nqts) + 3  # wider than any query: the stack's extra columns hold junk
    L = rng.uniform(5, 9, (len(nqts), k, T)).astype(np.float32)
    P = rng.uniform(5, 9, (len(nqts), m, 256, T)).astype(np.float32)
    for i, t in enumerate(nqts):
        L[i, :, :t], P[i, ..., :t] = luts[i], pqs[i]
    cands = [rng.choice(400, size=s, replace=False).astype(np.int64) for s in (90, 40, 7, 60, 1, 30)]
    cands[0][:3] = [0, 1, 2]  # empty documents score 0
    cand, qid = np.concatenate(cands), np.repeat(np.arange(len(nqts)), [len(c) for c in cands])
    nqt = np.array(nqts, np.int64)
    batch = np.empty(len(cand), np.float32)
    mk.final_pass_pq_batch(L, P, nqt, qid, off, codes, res, scale, half, cand, batch)
    vals = half[scale]
    at = 0
    for i, c in enumerate(cands):
        one = np.empty(len(c), np.float32)
        mk.final_pass_pq(luts[i], pqs[i], off, codes, res, scale, half, c, one)
        assert np.array_equal(one, batch[at:at + len(c)]), nqts[i]
        # reference: every stored token's score decoded in numpy, then MaxSim
        tok = (luts[i][codes] + sum(pqs[i][j][res[:, j]] for j in range(m))) * vals[:, None]
        ref = [0.0 if off[r] == off[r + 1] else tok[off[r]:off[r + 1]].max(0).sum() for r in c]
        np.testing.assert_allclose(one, ref, rtol=1e-5, atol=1e-5)
        at += len(c)
    assert (batch[:3] == 0).all()
    for low in (0, 10**9):
        monkeypatch.setattr(mk, "PARALLEL_MIN", low)
        with mk.threads_for(len(cand)):
            again = np.empty(len(cand), np.float32)
            mk.final_pass_pq_batch(L, P, nqt, qid, off, codes, res, scale, half, cand, again)
        assert np.array_equal(again, batch)
    pytest.importorskip("torch")
    from polyindex.cuda.multivector import Kernels
    got = np.empty(len(cand), np.float32)
    Lz, Pz = np.zeros_like(L), np.zeros_like(P)  # the twin's stack: zero past each query
    for i, t in enumerate(nqts):
        Lz[i, :, :t], Pz[i, ..., :t] = luts[i], pqs[i]
    Kernels("cpu", half).final_pass_pq_batch(Lz, Pz, nqt, qid, off, codes, res, scale, half,
                                             cand, got)
    np.testing.assert_allclose(got, batch, rtol=1e-5, atol=1e-5)
