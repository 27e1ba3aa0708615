"""The dense kind: factory strings, training, search params, masks, save/open, placement."""
import faiss
import numpy as np
import pytest

from polyindex import InvalidArgument
from polyindex.cuda.device import check_device
from polyindex.index.dense.kind import DenseKind
from polyindex.index.protocol import BuildBatch, Query
from polyindex.index.registry import from_factory


def unit(n, d=32, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def batch(x):
    ids = [str(i) for i in range(len(x))]
    return BuildBatch(ids, [""] * len(x), ["t"] * len(x), x)


def build_open(kind, x, tmp_path):
    info = kind.build(batch(x), tmp_path)
    return kind.open(tmp_path, info), info


def exact_topk(x, q, k):
    s = q @ x.T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, 1), order


def test_auto_is_flat_and_exact(tmp_path):
    x, q = unit(500), unit(7, seed=1)
    kind = from_factory("dense")
    seg, info = build_open(kind, x, tmp_path)
    assert info["factory"] == "Flat" and kind.describe() == "dense"
    prepared = kind.prepare([Query(vector=v) for v in q], [seg], [None], {}, {})
    scores, rows = seg.search(prepared, 10, {}, None)
    ref_s, ref_r = exact_topk(x, q, 10)
    assert np.array_equal(rows, ref_r) and np.allclose(scores, ref_s, atol=1e-5)
    assert np.allclose(seg.score(prepared, rows[0]), q @ x[rows[0]].T, atol=1e-5)


def test_search_is_single_threaded_in_any_thread(tmp_path):
    """OpenMP's thread count is per thread: a search from a fresh thread (a server worker) must
    use QUERY_THREADS too, and leave the thread's own setting as it was."""
    import threading

    from polyindex.index.dense import kind as dense
    x, q = unit(300), unit(2, seed=3)
    kind = from_factory("dense")
    seg, _ = build_open(kind, x, tmp_path)
    prepared = kind.prepare([Query(vector=v) for v in q], [seg], [None], {}, {})
    seen = {}

    class Recording:  # the real index, recording OpenMP's thread count during its search
        def __init__(self, index):
            self.index = index

        def search(self, *args, **kw):
            seen["during"] = faiss.omp_get_max_threads()
            return self.index.search(*args, **kw)

    seg.index = Recording(seg.index)

    def worker():
        faiss.omp_set_num_threads(2)  # what a new thread gets on a 2-core machine
        seen["result"] = seg.search(prepared, 5, {}, None)
        seen["after"] = faiss.omp_get_max_threads()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["during"] == dense.QUERY_THREADS and seen["after"] == 2
    assert np.array_equal(seen["result"][1], exact_topk(x, q, 5)[1])


def test_allow_mask_and_padding(tmp_path):
    x, q = unit(50), unit(2, seed=3)
    kind = DenseKind("Flat")
    seg, _ = build_open(kind, x, tmp_path)
    allow = np.zeros(50, dtype=bool)
    allow[[3, 17, 40]] = True
    prepared = kind.prepare([Query(vector=v) for v in q], [seg], [None], {}, {})
    scores, rows = seg.search(prepared, 5, {}, allow)
    assert set(rows[0, :3]) == {3, 17, 40} and (rows[:, 3:] == -1).all()
    assert np.isneginf(scores[:, 3:]).all() or (scores[:, 3:] < -1e30).all()


def test_ivf_trains_template_and_nprobe_matters(tmp_path):
    x, q = unit(2000, seed=4), unit(20, seed=5)
    kind = from_factory("dense:IVF16,Flat")
    assert kind.needs_training()
    kind.train(batch(x[:1000]))
    assert not kind.needs_training()
    art = tmp_path / "art"
    art.mkdir()
    assert kind.save_artifacts(art) == ["dense.template.faiss"]
    again = from_factory("dense:IVF16,Flat")
    again.load_artifacts(art)
    assert not again.needs_training()
    seg, info = build_open(again, x, tmp_path)
    assert info["factory"] == "IVF16,Flat"
    prepared = again.prepare([Query(vector=v) for v in q], [seg], [None], {"nprobe": "16"}, {})
    _, rows_all = seg.search(prepared, 10, {"nprobe": "16"}, None)
    _, ref = exact_topk(x, q, 10)
    assert np.array_equal(rows_all, ref)  # probing every list is exhaustive
    _, rows_one = seg.search(prepared, 10, {"nprobe": "1"}, None)
    assert not np.array_equal(rows_one, ref)  # one list of 16 misses some neighbours


def test_hnsw_and_pq_strings(tmp_path):
    x, q = unit(3000, seed=6), unit(20, seed=7)
    kind = from_factory("dense:HNSW32,Flat")
    (tmp_path / "h").mkdir()
    seg, _ = build_open(kind, x, tmp_path / "h")
    prepared = kind.prepare([Query(vector=v) for v in q], [seg], [None], {"efSearch": "256"}, {})
    _, rows = seg.search(prepared, 10, {"efSearch": "256"}, None)
    _, ref = exact_topk(x, q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, ref)])
    assert recall > 0.95
    pq = from_factory("dense:PQ8")
    pq.train(batch(x))
    # no polysemous training (it relabels centroids for a Hamming search nothing uses: same
    # ADC scores, 30x the training time here)
    assert not faiss.downcast_index(pq.template).do_polysemous_training
    (tmp_path / "p").mkdir()
    seg, _ = build_open(pq, x, tmp_path / "p")
    _, rows = seg.search(pq.prepare([Query(vector=v) for v in q], [seg], [None], {}, {}), 10, {}, None)
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, ref)]) > 0.2


@pytest.mark.parametrize("factory, message", [
    ("dense:Bogus42", "not a valid faiss index factory string"),
    ("nosuchkind", "unknown index kind 'nosuchkind'"),
    ("", "non-empty"),
])
def test_bad_factory_strings(factory, message):
    with pytest.raises(InvalidArgument, match=message):
        from_factory(factory)


def test_bad_search_params(tmp_path):
    kind = DenseKind("Flat")
    seg, _ = build_open(kind, unit(10), tmp_path)
    with pytest.raises(InvalidArgument, match="unknown search parameter"):
        kind.prepare([Query(vector=unit(1)[0])], [seg], [None], {"nprob": "3"}, {})
    with pytest.raises(InvalidArgument, match="not an integer"):
        kind.prepare([Query(vector=unit(1)[0])], [seg], [None], {"nprobe": "many"}, {})


def test_gpu_placement_is_explicit():
    assert check_device("cpu") == "cpu"
    with pytest.raises(InvalidArgument, match="device must be one of"):
        check_device("tpu")
    import torch
    if faiss.get_num_gpus() == 0 and not torch.cuda.is_available():
        with pytest.raises(InvalidArgument, match="neither torch nor faiss sees a GPU"):
            check_device("cuda")
