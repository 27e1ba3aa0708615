"""The vector lane's small flat part (``index/dense/small_flat``): one compacted flat
inner-product segment answered by faiss's own row kernel and a numba top k gives exactly
the hits faiss's search gave through the lane before (ids, order, score bits, ranks), ties
inside the top k in id order, a tie at the k-th place handed to faiss's search."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.index.dense import small_flat
from polyindex.query.pipeline import run
from polyindex.query.requests import make_queries


def general(coll, v, k):
    queries = make_queries(None, [v])
    return run(coll.view(), queries, coll._profile("dense"), k)[0]


def key(hits):
    return [(h.id, h.rank, np.float32(h.score).tobytes()) for h in hits]


def plan_of(coll):
    return coll._lane("dense", "vector", None, [np.zeros(1, np.float32)])[1]


@pytest.fixture
def tied(eng):
    """80 rows of 16-d: rows 5..9 one vector (a tie run), rows 20/21 another; ids whose
    string order is not row order (``d9`` > ``d10``), so id order visibly decides ties."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((80, 16)).astype(np.float32)
    x[5:10] = x[5]
    x[20:22] = x[20]
    coll = eng.create_collection("v", ["dense"], model=None)
    coll.add([{"id": f"d{79 - i}", "vector": x[i]} for i in range(80)])
    return coll, x


def test_small_flat_equals_the_general_path(tied):
    coll, x = tied
    plan = plan_of(coll)
    assert isinstance(plan.small, small_flat.SmallFlat)
    qs = list(np.random.default_rng(4).standard_normal((20, 16)).astype(np.float32))
    qs += [x[5], x[20], x[7] * 2]  # the tie runs on top
    for q in qs:
        for k in (1, 2, 3, 5, 6, 10, 79, 80, 200):
            got = coll.query(vector=q, k=k, profile="dense")
            assert key(got) == key(general(coll, q, k)), (k,)
            assert len(got) == min(k, 80)


def test_ties_in_id_order_and_a_tie_at_the_kth_place_goes_to_faiss(tied, monkeypatch):
    coll, x = tied
    plan = plan_of(coll)
    calls = []
    real = small_flat.SmallFlat.rank

    def spy(self, v, k, max_sq):
        got = real(self, v, k, max_sq)
        calls.append(got is None)
        return got
    monkeypatch.setattr(small_flat.SmallFlat, "rank", spy)
    hits = coll.query(vector=x[5], k=5, profile="dense")  # the run of five is the top five
    assert calls == [False]
    assert [h.id for h in hits] == sorted(f"d{79 - i}" for i in range(5, 10))
    assert key(hits) == key(general(coll, x[5], 5))
    hits = coll.query(vector=x[5], k=3, profile="dense")  # the run straddles the 3rd place
    assert calls == [False, True]  # faiss's search decides which of the run are kept
    assert key(hits) == key(general(coll, x[5], 3))
    assert plan.small is plan_of(coll).small  # kept on the segment, not remade


@pytest.mark.parametrize("dim", [small_flat.MIN_DIM, 16, 17, 32, 100, 384, 768])
def test_row_kernel_gives_faiss_search_bits(dim):
    rng = np.random.default_rng(5)
    for n in (10, 300, 5000):
        x = rng.standard_normal((n, dim)).astype(np.float32)
        index = faiss.IndexFlatIP(dim)
        index.add(x)
        for q in rng.standard_normal((3, dim)).astype(np.float32):
            d, i = index.search(q[None], n)
            out = np.empty(n, np.float32)
            small_flat._ny(small_flat._ptr(out), small_flat._ptr(q), small_flat._ptr(x), dim, n)
            assert out[i[0]].tobytes() == d[0].tobytes(), (dim, n)


def test_small_dimensions_keep_faiss_search(eng):
    """d=8: faiss's search scores with a kernel of its own (other float32 bits), so such a
    segment is not taken (answers must not change when segments merge)."""
    rng = np.random.default_rng(6)
    coll = eng.create_collection("d8", ["dense"], model=None)
    coll.add([{"id": f"d{i}", "vector": v} for i, v in
              enumerate(rng.standard_normal((50, 8)).astype(np.float32))])
    assert plan_of(coll).small is None


def test_what_the_small_part_does_not_take(eng):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    for factory in ("dense:metric=l2,Flat", "dense:metric=cosine,Flat", "dense:HNSW16,Flat"):
        coll = eng.create_collection(factory.replace(":", "_").replace(",", "_")
                                     .replace("=", "_"), [factory], model=None)
        coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(50)])
        assert plan_of(coll).small is None, factory
    coll = eng.create_collection("tomb", ["dense"], model=None)
    coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(50)])
    coll.delete(["d3"])  # a tombstone: the part is no longer plain
    assert plan_of(coll).small is None
    hits = coll.query(vector=x[3], k=50, profile="dense")
    assert "d3" not in [h.id for h in hits] and key(hits) == key(general(coll, x[3], 50))
    # vectors the fast check does not take still answer as the general path
    for v in (x[4].astype(np.float64), list(x[4]), np.asfortranarray(x[4:5])[0]):
        assert key(coll.query(vector=v, k=5, profile="dense")) == key(general(coll, x[4], 5))


def test_unusual_vectors_get_the_general_errors(eng):
    x = np.random.default_rng(7).standard_normal((30, 16)).astype(np.float32)
    coll = eng.create_collection("v", ["dense"], model=None)
    coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(30)])
    assert plan_of(coll).small is not None
    zero = np.zeros(16, np.float32)  # inner product takes it: the general path answers
    assert key(coll.query(vector=zero, k=5, profile="dense")) == key(general(coll, zero, 5))
    for bad in (np.full(16, np.nan, np.float32),
                np.array([np.inf] + [0.0] * 15, np.float32), np.full(16, 1e30, np.float32)):
        with pytest.raises(InvalidArgument):
            coll.query(vector=bad, k=5, profile="dense")


def test_large_k_and_a_tie_run_across_it(eng, monkeypatch):
    """Every k is kept in one heap of k + 1: the same hits at k past 128 (the old partition's
    range) as at small k, and a tie run across the k-th place (rows 140..160 score alike,
    places 141..161) goes to faiss."""
    x = np.zeros((300, 16), np.float32)
    x[:, 0] = -np.arange(300, dtype=np.float32)
    x[:, 1] = 1.0
    x[140:161, 0] = -140.0
    coll = eng.create_collection("v", ["dense"], model=None)
    coll.add([{"id": f"d{(i * 7919) % 300:03d}", "vector": x[i]} for i in range(300)])
    q = np.eye(16, dtype=np.float32)[0]
    calls = []
    real = small_flat.SmallFlat.rank
    monkeypatch.setattr(small_flat.SmallFlat, "rank", lambda self, v, k, mx: calls.append(
        k) or real(self, v, k, mx))
    for k in (1, 130, 140, 150, 161, 170, 300, 400):
        got = coll.query(vector=q, k=k, profile="dense")
        assert key(got) == key(general(coll, q, k)), k
        assert coll.query_ids(vector=q, k=k, profile="dense").hits() == got
    assert calls == [1, 1, 130, 130, 140, 140, 150, 150, 161, 161, 170, 170, 300, 300,
                     400, 400]
    ranks = np.arange(300, dtype=np.int32)[::-1].copy()  # ids in reverse row order
    m = small_flat.top_k(x[:, 0].copy(), q, 1e30, 150, ranks, np.empty(150, np.int64), np.empty(150))
    assert m == -1  # the straddling run: faiss decides
    rows, top = np.empty(170, np.int64), np.empty(170)
    m = small_flat.top_k(x[:, 0].copy(), q, 1e30, 170, ranks, rows, top)
    assert m == 170 and list(rows[:5]) == [0, 1, 2, 3, 4] and top.dtype == np.float64
    assert list(rows[140:161]) == list(range(160, 139, -1))  # the tie run by rank
    assert top.tolist() == x[rows, 0].tolist()


def test_top_k_against_a_sort(eng):
    """The heap against numpy's sort by (score desc, id rank asc) on random scores with many
    equal values, every k from 1 to n + 1 (n and n + 1: all rows), in rows of any order."""
    rng = np.random.default_rng(8)
    q = np.ones(4, np.float32)
    for n in (1, 2, 7, 64, 300):
        for _ in range(4):
            scores = rng.integers(0, max(2, n // 3), n).astype(np.float32) / 7
            ranks = rng.permutation(n).astype(np.int32)
            order = np.lexsort((ranks, -scores))  # score desc, then id rank
            for k in range(1, n + 2):
                kk = min(k, n)
                rows, top = np.empty(kk, np.int64), np.empty(kk)
                m = small_flat.top_k(scores, q, 1e30, k, ranks, rows, top)
                if kk < n and scores[order[kk]] == scores[order[kk - 1]]:
                    assert m == -1, (n, k)
                    continue
                assert m == kk and rows.tolist() == order[:kk].tolist(), (n, k)
                assert top.tolist() == scores[order[:kk]].astype(np.float64).tolist()
    for bad in (np.zeros(4, np.float32), np.full(4, np.nan, np.float32)):
        assert small_flat.top_k(np.ones(3, np.float32), bad, 1e30, 2, np.arange(3, dtype=np.int32),
                                np.empty(2, np.int64), np.empty(2)) == -2


def test_the_kernel_scores_through_faiss_own_function(tied, monkeypatch):
    """``scan_top_k`` calls faiss's ``fvec_inner_products_ny`` through its address: the same
    rows and score bits as ``_ny``'s scores handed to ``top_k``, and without the address (a
    faiss build whose library does not show it) the lane answers the same."""
    coll, x = tied
    assert small_flat.NY_AT  # the faiss-cpu wheel this project pins
    small = plan_of(coll).small
    rng = np.random.default_rng(9)
    for q in list(rng.standard_normal((10, 16)).astype(np.float32)) + [x[5], x[20]]:
        for k in (1, 4, 10, 80, 81):
            m = min(k, small.n)
            want_rows, want_top = np.empty(m, np.int64), np.empty(m)
            scores = np.empty(small.n, np.float32)
            small_flat._ny(small_flat._ptr(scores), small_flat._ptr(q), small.xb_ptr,
                           small.d, small.n)
            want = small_flat.top_k(scores, q, 1e30, k, small.ranks, want_rows, want_top)
            rows, top = np.empty(m, np.int64), np.empty(m)
            got = small_flat.scan_top_k(small_flat.NY_AT, q, small.xb, small.d, 1e30, k,
                                        small.ranks, rows, top)
            assert got == want
            if got > 0:
                assert rows[:got].tolist() == want_rows[:got].tolist()
                assert top.tobytes() == want_top.tobytes()
    hits = {k: key(coll.query(vector=x[20], k=k, profile="dense")) for k in (1, 2, 5, 80)}
    monkeypatch.setattr(small_flat, "NY_AT", 0)
    for k, want in hits.items():
        assert key(coll.query(vector=x[20], k=k, profile="dense")) == want


def test_vectors_copied_to_a_cache_line(tied):
    """A memory-mapped flat index's codes start off a cache line (the file's header); the
    small part scans an aligned copy with the same bits, and an aligned array is kept."""
    coll, _ = tied
    small = plan_of(coll).small
    assert small.xb.ctypes.data % small_flat.ALIGN == 0 and not small.xb.flags.writeable
    codes = faiss.rev_swig_ptr(small.index.get_xb(), small.n * small.d)
    assert small.xb.tobytes() == codes.tobytes()
    raw = np.empty(1000 + 16, np.float32)
    off = raw[(-raw.ctypes.data % 64) // 4 + 1:][:1000]  # 4 bytes past a line
    assert small_flat.aligned(off).ctypes.data % 64 == 0
    assert small_flat.aligned(off).tobytes() == off.tobytes()
    on = raw[(-raw.ctypes.data % 64) // 4:][:1000]
    assert small_flat.aligned(on) is on
