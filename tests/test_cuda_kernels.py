"""The torch kernels of ``polyindex.cuda`` on device="cpu" against their CPU twins in index/:
scores within 1e-4 (relative to the scores' scale) and the same top-k, on random data and on
the shipped demo collection (through the engine, ``POLYINDEX_KERNELS=torch`` against the
default CPU kernels: the code path a cuda placement runs)."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from polyindex.cuda import dense as tdense
from polyindex.cuda import multivector as tmv
from polyindex.cuda import sparse as tsparse
from polyindex.cuda.device import check_device, torch_kernels
from polyindex.errors import InvalidArgument
from polyindex.index.multivector import kernels as mk
from polyindex.index import postings
from polyindex.index.sparse import kernels as sparse_kernels
from polyindex.index.multivector.kernels import top as _top
from polyindex.index.postings import half_lut

HALF = half_lut()
RTOL = 1e-4


def close(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    fin = np.isfinite(b)
    assert (np.isfinite(a) == fin).all()
    scale = max(1e-6, float(np.abs(b[fin]).max()) if fin.any() else 1.0)
    assert np.abs(a[fin] - b[fin]).max(initial=0) <= RTOL * scale


def random_segment(rng, n=400, k=64, m=8, t_max=14):
    lens = rng.integers(0, t_max, n)
    lens[:3] = 0  # documents without tokens score 0
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    nt = int(off[-1])
    codes = rng.integers(0, k, nt).astype(np.uint16)
    res = rng.integers(0, 256, (nt, m)).astype(np.uint8)
    scale = rng.uniform(0.8, 1.25, nt).astype(np.float16).view(np.uint16)
    doc = np.repeat(np.arange(n), lens)
    pairs = np.unique(codes.astype(np.int64) * n + doc)
    ivf_off = np.searchsorted(pairs // n, np.arange(k + 1)).astype(np.int64)
    return off, codes, res, scale, ivf_off, (pairs % n).astype(np.int32)


def test_multivector_kernels_match_numba():
    rng = np.random.default_rng(1)
    off, codes, res, scale, ivf_off, ivf_docs = random_segment(rng)
    t = 7
    lut = rng.standard_normal((64, t)).astype(np.float32)
    pq = (rng.standard_normal((8, 256, t)) * 0.2).astype(np.float32)
    cand = rng.permutation(len(off) - 1)[:300].astype(np.int64)
    kt = tmv.Kernels("cpu", HALF)
    for name, args in [("first_pass_lut", (lut, off, codes)),
                       ("final_pass_pq", (lut, pq, off, codes, res, scale, HALF))]:
        ref, got = np.empty(len(cand), np.float32), np.full(len(cand), np.nan, np.float32)
        getattr(mk, name)(*args, cand, ref)
        getattr(kt, name)(*args, cand, got)
        close(got, ref)
        assert (got[np.isin(cand, [0, 1, 2])] == 0).all()
    qsig = rng.integers(0, 2 ** 63, t, dtype=np.uint64)
    csig = rng.integers(0, 2 ** 63, 64, dtype=np.uint64)
    ref, got = np.empty(len(cand), np.float32), np.empty(len(cand), np.float32)
    mk.first_pass_hamming(qsig, csig, 64, off, codes, cand, ref)
    kt.first_pass_hamming(qsig, csig, 64, off, codes, cand, got)
    close(got, ref)
    allow = rng.random(len(off) - 1) < 0.5
    probes = np.array([3, 9, 40], np.int64)
    n_rows = len(off) - 1
    for use in (False, True):
        a, b = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
        mark = np.zeros(n_rows, np.uint8)
        na = mk.gather_candidates(ivf_off, ivf_docs, probes, allow, use, mark, a)
        nb = kt.gather_candidates(ivf_off, ivf_docs, probes, allow, use, mark, b)
        assert na == nb > 0 and sorted(a[:na]) == list(b[:nb])


def _cpu_search(off, codes, res, scale, ivf_off, ivf_docs, lut, pq, probes, k, ndocs):
    """MultivectorSegment.search's steps over the numba kernels (one query)."""
    n = len(off) - 1
    buf, mark = np.empty(n, np.int64), np.zeros(n, np.uint8)
    cand = buf[:mk.gather_candidates(ivf_off, ivf_docs, probes, mark.view(bool), False, mark,
                                     buf)].copy()
    if len(cand) > max(k, ndocs):
        first = np.empty(len(cand), np.float32)
        mk.first_pass_lut(lut, off, codes, cand, first)
        _, cand = _top(first, cand, max(k, ndocs))
    final = np.empty(len(cand), np.float32)
    mk.final_pass_pq(lut, pq, off, codes, res, scale, HALF, cand, final)
    return _top(final, cand, k)


def test_multivector_search_batch_matches_cpu_search():
    rng = np.random.default_rng(2)
    off, codes, res, scale, ivf_off, ivf_docs = random_segment(rng, n=600)
    seg = tmv.SegmentTensors(off, codes, res, scale, ivf_off, ivf_docs, "cpu", HALF)
    luts, pqs, probes = [], [], []
    for t in (3, 9, 5, 1):  # different token counts: padded on the device
        luts.append(rng.standard_normal((64, t)).astype(np.float32))
        pqs.append((rng.standard_normal((8, 256, t)) * 0.2).astype(np.float32))
        probes.append(np.unique(rng.integers(0, 64, 6)))
    k, ndocs = 10, 40
    s, r = tmv.search_batch(seg, luts, pqs, probes, k, ndocs)
    for i in range(len(luts)):
        rs, rr = _cpu_search(off, codes, res, scale, ivf_off, ivf_docs, luts[i], pqs[i],
                             probes[i], k, ndocs)
        assert list(r[i, :len(rr)].numpy()) == list(rr)
        close(s[i, :len(rs)].numpy(), rs)


def _csr(rng, n_rows, dim, nnz):
    terms = rng.integers(0, dim, nnz)
    rows = rng.integers(0, n_rows, nnz)
    key = np.unique(terms * n_rows + rows)
    terms, rows = key // n_rows, key % n_rows
    vals = rng.uniform(0.01, 1, len(key)).astype(np.float16).view(np.uint16)
    off = np.searchsorted(terms, np.arange(dim + 1)).astype(np.int64)
    return off, rows.astype(np.int32), vals


def test_sparse_search_matches_numba():
    rng = np.random.default_rng(3)
    n_rows, dim = 500, 256
    off, docs, vals = _csr(rng, n_rows, dim, 6000)
    nq = 5
    qptr = np.array([0, 4, 4, 12, 13, 20], np.int64)  # query 1 has no terms
    qterms = np.concatenate([rng.choice(dim, int(c), replace=False) for c in np.diff(qptr)])
    qweights = rng.uniform(0.1, 2, len(qterms))
    seg = tsparse.SparseTensors(off, docs, vals, False, n_rows, "cpu", HALF)
    for allow in (None, rng.random(n_rows) < 0.3):
        for k in (1, 10, 600):
            counts = np.zeros(nq, np.int64)
            args = (off, docs, vals, HALF, False, qptr, qterms, qweights, counts)
            rs, rr = postings.run_search(sparse_kernels.sparse_search, args,
                                         postings.BufferPool(n_rows), nq, k, allow)
            s, r, c = tsparse.search(seg, qptr, qterms, qweights, k, allow)
            assert (r.numpy() == rr).all()
            close(s.numpy(), rs)
            assert (c == counts).all()
    assert (r[1] == -1).all()


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_dense_flat_and_ivf_match_faiss(metric):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    q = rng.standard_normal((7, 32)).astype(np.float32)
    _check_dense(x, q, metric)


def _check_dense(x, q, metric, nlist=16):
    fm = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    sign = -1 if metric == "l2" else 1
    flat = faiss.index_factory(x.shape[1], "Flat", fm)
    flat.add(x)
    seg = tdense.DenseTensors(x, metric, "cpu")
    k = 25
    fs, fr = flat.search(q, k)
    s, r = tdense.flat_search(seg, q, k)
    assert (r.numpy() == fr).all()
    close(s.numpy(), sign * fs)
    allow = np.random.default_rng(5).random(len(x)) < 0.1
    fs, fr = flat.search(q, k, params=faiss.SearchParameters(
        sel=faiss.IDSelectorBatch(np.flatnonzero(allow).astype(np.int64))))
    s, r = tdense.flat_search(seg, q, k, allow)
    assert (r.numpy() == fr).all()
    ivf = faiss.index_factory(x.shape[1], f"IVF{nlist},Flat", fm)
    ivf.train(x)
    ivf.add(x)
    seg.with_ivf(*tdense.ivf_parts(ivf))
    for nprobe in (1, 4):
        ivf.nprobe = nprobe
        fs, fr = ivf.search(q, k)
        s, r = tdense.ivf_search(seg, q, k, nprobe)
        assert (r.numpy() == fr).all()
        close(s.numpy(), np.where(fr < 0, -np.inf, sign * fs))


def test_placement_errors_and_switch(setting):
    with pytest.raises(InvalidArgument, match="device must be one of"):
        check_device("gpu")
    import torch
    if not torch.cuda.is_available() and faiss.get_num_gpus() == 0:
        with pytest.raises(InvalidArgument, match="sees a GPU"):
            check_device("cuda")
    setting("POLYINDEX_KERNELS", None)
    assert not torch_kernels("cpu") and torch_kernels("cuda")
    setting("POLYINDEX_KERNELS", "numba")
    assert not torch_kernels("cpu")
    setting("POLYINDEX_KERNELS", "torch")
    assert torch_kernels("cpu")


def test_cli_device_cuda_without_gpu_is_a_clear_error(tmp_path):
    import torch

    from conftest import run_cli
    if torch.cuda.is_available() or faiss.get_num_gpus():
        pytest.skip("this machine has a GPU")
    (tmp_path / "c.jsonl").write_text('{"id": "1", "text": "a"}\n')
    for args in (("index", str(tmp_path / "c.jsonl"), "--data", str(tmp_path / "d"), "-c", "x",
                  "--device", "cuda"),
                 ("serve", "--data", str(tmp_path / "d"), "--port", "0", "--device", "cuda")):
        proc = run_cli(*args, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "device 'cuda' was asked for" in proc.stderr
    assert not (tmp_path / "d").exists()  # nothing was created


# -- the shipped demo collection, through the engine ------------------------------------------
DEMO_DOCS = 90
DEMO_WORDS = 40  # the first words of each document: bfloat16 encoding on a CPU is slow
MV = "multivector:KMeans64,residual=PQ16"  # OPQ's training would cost a minute here


def demo_subset(path, n):
    """The first ``n`` documents of the shipped Cranfield demo, cut to ``DEMO_WORDS`` words."""
    import json

    from polyindex.cli.demo import DEMO_DATA
    with open(DEMO_DATA / "corpus.jsonl") as f, open(path, "w") as out:
        for _, line in zip(range(n), f):
            d = json.loads(line)
            d["text"] = " ".join(d["text"].split()[:DEMO_WORDS])
            out.write(json.dumps(d) + "\n")
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    import polyindex
    from polyindex.cli.demo import DEMO_DATA
    from polyindex.ingest.sources import read_queries
    tmp = tmp_path_factory.mktemp("demo")
    src = demo_subset(tmp / "corpus.jsonl", DEMO_DOCS)
    eng = polyindex.open(tmp / "data")
    coll = eng.create_collection("cran", ["dense", "sparse", MV],
                                 segment_size=30)  # three segments
    coll.index(src)
    queries = [t for _, t in read_queries(DEMO_DATA / "queries.jsonl")][:12]
    yield coll, queries, src
    eng.close()


@pytest.mark.parametrize("profile", ["dense", "sparse", "multivector"])
def test_demo_collection_torch_path_equals_cpu(demo, profile, setting):
    coll, queries, _ = demo
    setting("POLYINDEX_KERNELS", None)
    ref = coll.query_batch(queries, k=20, profile=profile)
    setting("POLYINDEX_KERNELS", "torch")
    got = coll.query_batch(queries, k=20, profile=profile)
    assert all(len(h) > 0 for h in ref) and sum(len(h) for h in ref) > 10 * len(queries)
    for a, b in zip(got, ref):
        assert [h.id for h in a] == [h.id for h in b]
        close([h.score for h in a], [h.score for h in b])


def test_demo_embeddings_dense_twin(demo):
    """Flat and IVF in torch against faiss on the demo collection's real embeddings."""
    coll, queries, _ = demo
    x = np.concatenate([s.docs.embeddings() for s in coll.table.sealed_snapshot().segments])
    assert x.shape == (DEMO_DOCS, 384)
    q = coll.encoder.encode(queries)
    _check_dense(x, q, "ip", nlist=8)


def test_bulk_encoding_overlapped_with_building(tmp_path, setting):
    """The cuda placement's bulk pipeline (encode segment i+1 while segment i is built),
    forced on a CPU: the same segments, ingest positions and search results as in order."""
    import polyindex
    src = demo_subset(tmp_path / "corpus.jsonl", 24)
    eng = polyindex.open(tmp_path / "data")
    try:
        colls = []
        for name, flag in (("seq", "0"), ("overlap", "1")):
            setting("POLYINDEX_OVERLAP_ENCODE", flag)
            c = eng.create_collection(name, ["dense", MV], segment_size=8)
            report = c.index(src)
            assert (report.indexed, report.segments) == (24, 3)
            colls.append(c)
        seq, over = colls
        m1, m2 = seq.table.sealed_snapshot().manifest, over.table.sealed_snapshot().manifest
        assert [s.n_rows for s in m1.segments] == [s.n_rows for s in m2.segments] == [8, 8, 8]
        assert m1.ingest["position"] == m2.ingest["position"] == 24 and m2.ingest["done"]
        for profile in ("dense", "multivector"):
            a = seq.query("flow over a wing", k=10, profile=profile)
            b = over.query("flow over a wing", k=10, profile=profile)
            assert [h.id for h in a] == [h.id for h in b]
            close([h.score for h in a], [h.score for h in b])
    finally:
        eng.close()
