"""Pure-sparse levers and the built-in hybrids against their legs (issue 23).

At the kind level on the stored embeddings of ``bench/.work/engine/<name>`` (collections built
with lexical + dense; bench_quality's folder) and the judged test queries (cached in
``bench/.work/sparse/vec``); sparse scores are the exact sparse dot product of the projector's
codes (float16 document weights, as the index stores them: the index returns the same top-k),
so a lever's effect is measured without index or timing noise. nDCG@10 with ir-measures.

- ``hybrids NAME...``: legs (lexical BM25 top 1000 from the engine collection, dense flat,
  sparse pure and ``rescore=400``, tree default) and RRF (k=60) of lexical with each neural
  leg at neural weights 1, 1.5, 2, 3; JSON to ``bench/.work/sparse/hybrids-<name>.json``.
- ``levers NAME TAG,...``: one projector per trained lever (``TRAINED``; cached in
  ``bench/.work/sparse/proj``), each at the doc/query k pairs of ``LEVER_GRID`` (env,
  ``kd/kq,...``) in the scoring modes of ``LEVER_MODES`` (env, default ``plain,norm,dec``):
  plain, with L2-normalized document codes (``norm``), with the query scored against the
  documents' reconstructions (``dec``, ``Projector.decode_query``, positive part) and as the
  index's ``recon`` option (least-squares document weights, signed query weights);
  JSON to ``bench/.work/sparse/levers-<name>.json``.

Usage: ``python bench/bench_sparse_levers.py hybrids cranfield medline`` /
``python bench/bench_sparse_levers.py levers nfcorpus base,d16384,nocontrast``
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

CACHE = common.WORK / "sparse" / "vec"
WEIGHTS = tuple(float(w) for w in os.environ.get("NEURAL_WEIGHTS", "1,1.5,2,3").split(","))


def load(name):
    f = CACHE / f"{name}.npz"
    if f.exists():
        z = np.load(f, allow_pickle=True)
        meta = json.loads(str(z["meta"]))
        return meta["ids"], z["x"], meta["qids"], z["q"], meta["qrels"]
    ids, _, _, x, qids, q, qrels = common.stored_collection(name, common.WORK / "sparse" / "engine")
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(f, x=x, q=q, meta=json.dumps({"ids": ids, "qids": qids, "qrels": qrels}))
    return ids, x, qids, q, qrels


def ndcg(S, ids, qids, qrels, tag="run", depth=100):
    import ir_measures
    from ir_measures import nDCG
    top = np.argpartition(-S, min(depth, S.shape[1] - 1), axis=1)[:, :depth]
    run = {}
    for qi, qid in enumerate(qids):
        rows = top[qi]
        rows = rows[np.lexsort((rows, -S[qi, rows]))]
        run[qid] = {ids[r]: float(S[qi, r]) for r in rows if S[qi, r] > -np.inf}
    qr = {q: {d: int(v) for d, v in r.items()} for q, r in qrels.items()}
    res = ir_measures.calc_aggregate([nDCG @ 10], qr, run)
    # judged queries missing from the run count 0: they are all in the run here
    return float(res[nDCG @ 10])


def csr(vals, dims, D):
    n, k = vals.shape
    return sp.csr_matrix((vals.ravel().astype(np.float32), dims.ravel(),
                          np.arange(0, n * k + 1, k)), shape=(n, D))


def sparse_scores(P, x, q, kd, kq, norm=False, dec=False, recon=False):
    """Exact sparse dot products (nq, n); ``dec``: query latents weigh ``w_dec_j . q`` (the
    query against the documents' reconstructions, ``Projector.decode_query``, positive part);
    ``recon``: the ``recon`` index (least-squares document weights, signed query weights,
    ``Projector.encode_recon`` / ``recon_query``)."""
    if recon:
        vd, dd = P.encode_recon(x, kd)
        vq, dq = P.recon_query(q, kq)
    else:
        vd, dd = P.encode(x, kd)
        vq, dq = P.decode_query(q, kq) if dec else P.encode(q, kq, queries=True)
    vd = vd.astype(np.float16).astype(np.float32)
    if norm:
        vd = vd / np.maximum(np.linalg.norm(vd, axis=1, keepdims=True), 1e-12)
    S = (csr(vq, dq, P.dim) @ csr(vd, dd, P.dim).T).toarray()
    if recon:  # signed: every row a query latent touches is returned, whatever its score
        S[(csr(np.ones_like(vq), dq, P.dim) @ csr(np.ones_like(vd), dd, P.dim).T).toarray()
          == 0] = -np.inf
    else:
        S[S <= 0] = -np.inf  # unmatched rows are not returned by the index
    return S


PROJ = common.WORK / "sparse" / "proj"


def train_cached(name, x, cfg, tag):
    """Train (or load) a projector for collection ``name`` under ``tag``."""
    from polyindex.index.sparse.projector import Projector, train
    folder = PROJ / f"{name}-{tag}"
    p = Projector.load(folder) if folder.exists() else None
    if p is None:
        t = time.time()
        p = train(x, cfg)
        p.meta["wall"] = time.time() - t
        folder.mkdir(parents=True, exist_ok=True)
        p.save(folder, decoder=True)  # the ' dec' scoring needs it
    if p.centre is None:  # cached before projectors kept it: the mean of the training rows,
        p.centre = x.mean(0)  # which is the collection (every measured one is < max_train)
    return p


def lexical_scores(name, qids, n_docs, ids):
    """BM25 top 1000 from the engine collection, as a (nq, n) score matrix (-inf elsewhere)."""
    f = CACHE / f"{name}.lexical.npy"
    if f.exists():
        return np.load(f)
    import polyindex
    folder = common.collection_folder(name)
    text = dict(common.read_queries(folder))
    coll = polyindex.open(common.WORK / "engine", readonly=True).collection(name)
    hits = coll.query_batch(texts=[text[q] for q in qids], k=1000, profile="lexical")
    pos = {d: i for i, d in enumerate(ids)}
    S = np.full((len(qids), n_docs), -np.inf, np.float32)
    for qi, hs in enumerate(hits):
        for h in hs:
            S[qi, pos[h.id]] = h.score
    np.save(f, S)
    return S


def topk(S, k):
    """Rows best first (ties by row), -1 where fewer than k scored."""
    out = np.full((len(S), k), -1, np.int64)
    for i, row in enumerate(S):
        cand = np.flatnonzero(row > -np.inf)
        cand = cand[np.lexsort((cand, -row[cand]))][:k]
        out[i, :len(cand)] = cand
    return out


def rrf_scores(lists, weights, n, k=60):
    """Weighted reciprocal rank fusion of per-leg ranked rows -> (nq, n) scores."""
    S = np.full((len(lists[0]), n), -np.inf)
    for rows, w in zip(lists, weights):
        for qi, r in enumerate(rows):
            r = r[r >= 0]
            cur = S[qi, r]
            S[qi, r] = np.where(cur == -np.inf, 0, cur) + w / (k + np.arange(1, len(r) + 1))
    return S


def rescored(S_sparse, q, x, R):
    """The sparse top R re-ranked by the exact dense inner product (rescore=R)."""
    rows = topk(S_sparse, R)
    out = np.full(S_sparse.shape, -np.inf, np.float32)
    for qi, r in enumerate(rows):
        r = r[r >= 0]
        out[qi, r] = x[r] @ q[qi]
    return out


def hybrids(names):
    import shutil

    import bench_sparse
    import torch
    torch.set_num_threads(1)
    from polyindex.index.sparse.projector import TrainConfig
    res = {}
    for name in names:
        ids, x, qids, q, qrels = load(name)
        n = len(ids)
        def ev(S, ids=ids, qids=qids, qrels=qrels):
            return ndcg(S, ids, qids, qrels)
        L = lexical_scores(name, qids, n, ids)
        D = q @ x.T
        P = train_cached(name, x, TrainConfig(dim=4096, ks=(16, 32, 64, 128), epochs=10), "base")
        Sp = sparse_scores(P, x, q, 64, 32)
        Sr = rescored(Sp, q, x, 400)
        # tree leg (kind level, default factory)
        from polyindex.index.registry import from_factory
        tmp = common.WORK / "sparse" / "tmp" / name
        shutil.rmtree(tmp, ignore_errors=True)
        tree = bench_sparse.System(from_factory("tree"), x, tmp / "tree")
        ts, tr, _ = tree.search(q, 100)
        T = np.full(D.shape, -np.inf, np.float32)
        for qi in range(len(q)):
            ok = tr[qi] >= 0
            T[qi, tr[qi][ok]] = ts[qi][ok]
        shutil.rmtree(tmp, ignore_errors=True)
        legs = {"lexical": L, "dense": D, "sparse-pure": Sp, "sparse-r400": Sr, "tree": T}
        r = {k: ev(v) for k, v in legs.items()}
        top = {"lexical": topk(L, 1000), **{k: topk(v, 100) for k, v in legs.items() if k != "lexical"}}
        for other in ("dense", "sparse-pure", "sparse-r400", "tree"):
            for w in WEIGHTS:
                r[f"lex+{other} w{w}"] = ev(rrf_scores([top["lexical"], top[other]], [1.0, w], n))
        res[name] = r
        print(name, json.dumps({k: round(v, 4) for k, v in r.items()}), flush=True)
        (common.WORK / "sparse" / f"hybrids-{name}.json").write_text(json.dumps(r))


# scoring modes per (kd, kq): plain, normalized document codes, positive decoder query, recon
MODES = tuple(f" {m}" if m else "" for m in os.environ.get(
    "LEVER_MODES", "plain,norm,dec").replace("plain", "").split(","))
GRID = tuple((int(a), int(b)) for a, b in (p.split("/") for p in os.environ.get(
    "LEVER_GRID", "32/32,64/32,64/64,128/64,128/128,64/256,128/256").split(",")))


def levers(name, tags):
    import torch
    torch.set_num_threads(1)
    from polyindex.index.sparse.projector import TrainConfig
    ids, x, qids, q, qrels = load(name)
    def ev(S):
        return ndcg(S, ids, qids, qrels)
    dn = ev(q @ x.T)
    KS = (16, 32, 64, 128)
    TRAINED = {
        "base": TrainConfig(dim=4096, ks=KS, epochs=10),
        "d16384": TrainConfig(dim=16384, ks=KS, epochs=10),
        "ep30": TrainConfig(dim=4096, ks=KS, epochs=30),
        "nocontrast": TrainConfig(dim=4096, ks=KS, epochs=10, w_contrastive=0.0),
        "tau05": TrainConfig(dim=4096, ks=KS, epochs=10, tau=0.05),
        "pool15": TrainConfig(dim=4096, ks=KS, epochs=10, pool=15, anchors=32),
        "kmax256": TrainConfig(dim=4096, ks=(32, 64, 128, 256), epochs=10),
        "d16384ep30": TrainConfig(dim=16384, ks=KS, epochs=30),
        "ep30tau05": TrainConfig(dim=4096, ks=KS, epochs=30, tau=0.05),
        "wc3": TrainConfig(dim=4096, ks=KS, epochs=10, w_contrastive=3.0),
        "tau05k256": TrainConfig(dim=4096, ks=(32, 64, 128, 256), epochs=10, tau=0.05),
        "tau05k512": TrainConfig(dim=4096, ks=(64, 128, 256, 512), epochs=10, tau=0.05),
        "k512": TrainConfig(dim=4096, ks=(64, 128, 256, 512), epochs=10),
        "k512s1": TrainConfig(dim=4096, ks=(64, 128, 256, 512), epochs=10, seed=1),
        "tau05k512ep20": TrainConfig(dim=4096, ks=(64, 128, 256, 512), epochs=20, tau=0.05),
        "d16384tau05k256": TrainConfig(dim=16384, ks=(32, 64, 128, 256), epochs=10, tau=0.05),
        "tau10k256": TrainConfig(dim=4096, ks=(32, 64, 128, 256), epochs=10, tau=0.1),
        "noflops": TrainConfig(dim=4096, ks=KS, epochs=10, w_flops=0.0),
    }
    out = {"dense": dn}
    for tag in tags:
        P = train_cached(name, x, TRAINED[tag], tag)
        for kd, kq in GRID:
            for mode in MODES:
                if kd > max(P.meta["ks"]) or (kq > max(P.meta["ks"]) and mode in ("", " norm")):
                    continue
                key = f"{tag} kd{kd} kq{kq}{mode}"
                out[key] = ev(sparse_scores(P, x, q, kd, kq, mode == " norm", mode == " dec",
                                            mode == " recon"))
                print(name, key, f"{out[key]:.4f} {out[key] / dn:.3f}x (train {P.meta.get('wall', 0):.0f}s)", flush=True)
        f = common.WORK / "sparse" / f"levers-{name}.json"
        old = json.loads(f.read_text()) if f.exists() else {}
        f.write_text(json.dumps({**old, **out}, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "hybrids":
        hybrids(sys.argv[2:])
    else:
        levers(sys.argv[2], sys.argv[3].split(","))
