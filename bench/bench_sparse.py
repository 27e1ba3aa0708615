"""The ``sparse`` kind (k-sparse autoencoder codes on an inverted index) vs ``dense`` flat.

Parts (``--parts quality,synthetic,train``):

- **quality**: per collection (cranfield, nfcorpus, arguana, cisi, medline, npl) the document embeddings are
  read from the engine collection bench_quality builds (``bench/.work/engine/<name>``, built
  with ``polyindex index`` under ``bench/.work/sparse/engine`` when absent) and the judged test
  queries are encoded with the engine's encoder (cached). One projector per collection is
  trained (``sparse:UHD<D>,k=64``: Multi-TopK over k = 16, 32, 64, 128); every
  ``k x {float, binary}`` index is built from it at the kind level (``IndexKind`` protocol),
  beside ``dense`` flat (``DenseKind("Flat")``) on the same vectors. nDCG@10 with ir-measures
  on TREC runs (top 100, judged queries); sparse is reported pure (its own scores) and with
  ``rescore=R`` (top R sparse candidates re-ranked by the exact inner product), and at the
  headline doc k (``--head-k``) also with fewer query latents (search param ``k``). Mean
  postings read per query (k=10), exhaustive and MaxScore (and whether both return the same
  top 10); queries/s one query at a time (prepare + search, query vectors precomputed: the
  text encoding both share is excluded; the projector is included), alternated with dense
  flat at FAISS's default threads and at one thread (ABBA, median of passes; ratios use the
  faster dense setting). Storage per document (the index files / documents).
  The headline config is also run through an engine collection (profile ``sparse``) to check
  the pipeline returns the kind-level run.
- **synthetic**: 200,000 embeddings drawn from a mixture of Gaussians centred on the real
  document embeddings of the collections above (noise sigma per dimension ``--sigma``,
  normalized), 200 queries drawn the same way; speed of sparse vs dense flat (one query at a
  time) and recall@10 of sparse against dense flat's top 10.
- **train**: projector training minutes on 10k and 100k synthetic documents (one thread).

Targets, checked per variant (all at once): nDCG@10 >= 0.97 x dense flat on every collection,
per-query time <= 1.0 x dense flat on npl and <= 1/3 on the synthetic corpus.

Results go to ``bench/results/bench_sparse.json`` under ``runs["UHD<D>"]`` (other D's runs are
kept; ``--merge`` also keeps this D's parts and collections not rerun).

Usage: ``python bench/bench_sparse.py [--collections ...] [--dim 4096] [--rescore 100]
[--parts quality,synthetic,train] [--ks 64] [--no-binary] [--passes 3] [--min-time 0.3] [--merge]``
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import WORK, console, median, table, verdict  # noqa: E402

SPARSE = WORK / "sparse"
KS = (16, 32, 64, 128)
HEAD_K = 10  # k of the timed queries and of the postings counts


# ------------------------------------------------------------------------------ systems

def _vectors(name: str):
    """(doc ids, doc embeddings, query ids, query embeddings, qrels) or None."""
    data = common.stored_collection(name, SPARSE / "engine")
    if data is None:
        return None
    ids, _, _, x, qids, q, qrels = data
    return ids, x, qids, q, qrels


class CachedCodes:
    """A projector that encodes the corpus once per k (the float and binary indexes share it)."""

    def __init__(self, projector, x: np.ndarray):
        self.p, self.x, self.codes = projector, x, {}

    def __getattr__(self, name):
        return getattr(self.p, name)

    def encode(self, x, k, queries=False):
        if x is not self.x or queries:
            return self.p.encode(x, k, queries)
        if k not in self.codes:
            self.codes[k] = self.p.encode(x, k)
        return self.codes[k]


class System:
    """One index over one set of vectors at the kind level: build, run, time."""

    def __init__(self, kind, x, folder: Path, params: dict[str, str] | None = None,
                 docs_from: Path | None = None):
        import os

        from polyindex.index.protocol import BuildBatch
        from polyindex.storage.segment import Segment, write_docs
        from polyindex.types import Document
        folder.mkdir(parents=True, exist_ok=True)
        ids = [str(i) for i in range(len(x))]
        if docs_from is not None:  # the same documents: link the file (rescoring reads it)
            os.link(docs_from / "docs.arrow", folder / "docs.arrow")
        else:
            write_docs(folder, [Document(i, "", "", {}) for i in ids], {}, x)
        t0 = time.perf_counter()
        info = kind.build(BuildBatch(ids, [""] * len(x), [""] * len(x), x), folder)
        self.build_s = time.perf_counter() - t0
        docs = Segment(folder, "s", len(ids))
        self.kind, self.seg, self.params = kind, kind.open(folder, info, docs), dict(params or {})
        self.bytes = sum((folder / f).stat().st_size for f in info["files"])

    def prepare(self, q, params=None):
        from polyindex.index.protocol import Query
        return self.kind.prepare([Query(vector=v) for v in q], [self.seg], [None],
                                 {**self.params, **(params or {})}, {})

    def search(self, q, k, params=None):
        prepared = self.prepare(q, params)
        scores, rows = self.seg.search(prepared, k, {}, None)
        return scores, rows, prepared

    def one_at_a_time(self, q, k=HEAD_K):
        for i in range(len(q)):
            self.search(q[i:i + 1], k)


def dense_rates(dense: System, q, min_time: float) -> dict:
    import faiss

    def one_thread():
        before = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            return common.rate(lambda: dense.one_at_a_time(q), len(q), min_time)
        finally:
            faiss.omp_set_num_threads(before)
    return {"dense": lambda: common.rate(lambda: dense.one_at_a_time(q), len(q), min_time),
            "dense-1t": one_thread}


def trec_ndcg(path: Path, rows, scores, ids, qids, qrels) -> float:
    run = {qid: [(ids[r], float(s)) for r, s in zip(rr, ss) if r >= 0]
           for qid, rr, ss in zip(qids, rows, scores)}
    common.write_trec(path, run, path.stem)
    return common.evaluate_trec(path, qrels)["nDCG@10"]


def train_projector(x, dim: int, epochs: int, folder: Path, retrain: bool = True):
    """Train the collection's projector once (k=64: Multi-TopK 16..128) and save it. Training
    is deterministic: without ``retrain`` a projector saved for the same input is reused
    (its recorded training time is reported)."""
    from polyindex.index.protocol import BuildBatch
    from polyindex.index.registry import from_factory
    from polyindex.index.sparse.projector import Projector
    kind = from_factory(f"sparse:UHD{dim},k=64,epochs={epochs}")
    digest = hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]
    old = Projector.load(folder) if folder.exists() and not retrain else None
    if old is not None and old.meta.get("input") == digest and old.meta.get("epochs") == epochs:
        return old.meta["seconds"], old.meta
    t0 = time.perf_counter()
    kind.train(BuildBatch([""] * len(x), [""] * len(x), [""] * len(x), x))
    seconds = time.perf_counter() - t0
    kind.projector.meta["input"] = digest
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    kind.save_artifacts(folder)
    return seconds, kind.projector.meta


def sparse_kind(dim: int, k: int, binary: bool, artifacts: Path, codes: CachedCodes | None = None):
    from polyindex.index.registry import from_factory
    kind = from_factory(f"sparse:UHD{dim},k={k}" + (",binary" if binary else ""))
    kind.load_artifacts(artifacts)
    if codes is not None:
        kind.projector = codes
    return kind


# ------------------------------------------------------------------------------ quality

def variants(k: int, args) -> list[dict]:
    """Query-time settings measured on an index with doc k: pure sparse scores, rescored, and
    (at the headline k) fewer query latents (search param ``k``) with rescoring."""
    out = [{"k_query": k, "rescore": 0}, {"k_query": k, "rescore": args.rescore}]
    if k == args.head_k:
        out += [{"k_query": kq, "rescore": args.rescore} for kq in KS if kq < k]
    return out


def vname(mode: str, k: int, v: dict) -> str:
    return f"{mode} k={k} kq={v['k_query']} " + (f"rescore={v['rescore']}" if v["rescore"] else "pure")


def vparams(v: dict, **extra) -> dict[str, str]:
    return {"k": str(v["k_query"]), "rescore": str(v["rescore"]), **extra}


def sparse_systems(x, art, args, tmp: Path):
    """Every (mode, k) index built from one projector (codes computed once)."""
    codes = CachedCodes(sparse_kind(args.dim, max(KS), False, art).projector, x)
    out = {}
    for binary in (False, True) if args.binary else (False,):
        for k in args.ks:
            mode = "binary" if binary else "float"
            out[(mode, k)] = System(sparse_kind(args.dim, k, binary, art, codes), x,
                                    tmp / f"sparse-{mode}-{k}", docs_from=tmp / "dense")
    return out


def timed(cands: dict, systems: dict, q, args) -> None:
    """Add one timing candidate per (mode, k, variant): one query at a time, k=10."""
    for (mode, k), sysm in systems.items():
        for v in variants(k, args):
            cands[vname(mode, k, v)] = (lambda s=sysm, p=vparams(v): common.rate(
                lambda: [s.search(q[i:i + 1], HEAD_K, p) for i in range(len(q))],
                len(q), args.min_time))
        sysm.one_at_a_time(q[:5])  # warm-up (numba)


def quality(name: str, args) -> dict | None:
    from polyindex.index.dense.kind import DenseKind
    data = _vectors(name)
    if data is None:
        return None
    ids, x, qids, q, qrels = data
    console.rule(f"{name}: {len(ids):,} docs, {len(qids)} judged queries")
    tmp = SPARSE / "tmp" / name
    shutil.rmtree(tmp, ignore_errors=True)
    runs = SPARSE / "runs" / name
    dense = System(DenseKind("Flat"), x, tmp / "dense")
    s, r, _ = dense.search(q, 100)
    out = {"docs": len(ids), "queries": len(qids), "dim": args.dim,
           "dense": {"ndcg10": trec_ndcg(runs / "dense.trec", r, s, ids, qids, qrels),
                     "bytes_per_doc": dense.bytes / len(ids)}}
    art = SPARSE / "artifacts" / f"{name}-{args.dim}"
    out["train_s"], out["projector"] = train_projector(x, args.dim, args.epochs, art, args.retrain)
    console.print(f"[dim]projector trained in {out['train_s']:.0f}s[/dim]")
    systems = sparse_systems(x, art, args, tmp)
    rows = []
    for (mode, k), sysm in systems.items():
        for v in variants(k, args):
            e = {"name": vname(mode, k, v), "mode": mode, "k": k, **v,
                 "bytes_per_doc": sysm.bytes / len(ids), "postings_total": int(sysm.seg.offsets[-1])}
            s, r, _ = sysm.search(q, 100, vparams(v))
            e["ndcg10"] = trec_ndcg(runs / f"{e['name'].replace(' ', '_')}.trec", r, s, ids, qids, qrels)
            found = {}
            for prune in ("exhaustive", "maxscore"):
                s, r, prep = sysm.search(q, HEAD_K, vparams(v, prune=prune))
                found[prune] = (float(prep.touched.mean()), r, s)
            e["postings_exhaustive"] = found["exhaustive"][0]
            e["postings_pruned"] = found["maxscore"][0]
            e["pruned_same_topk"] = bool(np.array_equal(found["exhaustive"][1], found["maxscore"][1])
                                         and np.array_equal(found["exhaustive"][2], found["maxscore"][2]))
            rows.append(e)
    # speed: one query at a time, every variant alternated with dense flat (FAISS's default
    # threads, and one thread: on a loaded machine OpenMP start-up can dominate a query)
    cands = dense_rates(dense, q, args.min_time)
    dense.one_at_a_time(q[:5])
    timed(cands, systems, q, args)
    samples = common.interleaved(cands, args.passes)
    out["dense"]["qps"] = median(samples["dense"])
    out["dense"]["qps_1thread"] = median(samples["dense-1t"])
    for e in rows:
        e["qps"] = median(samples[e["name"]])
    out["sparse"] = rows
    out["engine_check"] = engine_check(name, ids, x, qids, q, qrels, args, art)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def engine_check(name, ids, x, qids, q, qrels, args, art) -> dict:
    """The headline config through an engine collection: profile ``sparse`` and ``dense``."""
    import polyindex
    from polyindex.types import Document
    data = SPARSE / "engine-check"
    shutil.rmtree(data / name, ignore_errors=True)
    factory = f"sparse:UHD{args.dim},k={args.head_k},k_query={args.head_kq},rescore={args.rescore}"
    coll = polyindex.open(data).create_collection(name, ["dense", factory])
    dst = coll.table.artifact_dir("sparse")  # reuse the trained projector: commit it as the artifact
    files = [p.name for p in art.iterdir()]
    for f in files:
        shutil.copy(art / f, dst / f)
    coll.table.commit_metadata(artifacts={"sparse": files})
    coll.view()  # loads the artifact into the kind
    docs = [Document(i, "", "", {}) for i in ids]
    with coll.table.writer() as w:
        w.commit_segment(docs, {}, embeddings=x)
    coll.table.refresh()
    out = {"factory": factory}
    for profile in ("dense", "sparse"):
        hits = coll.query_batch(vectors=list(q), k=100, profile=profile)
        run = {qid: [(h.id, h.score) for h in hs] for qid, hs in zip(qids, hits)}
        path = SPARSE / "runs" / name / f"engine-{profile}.trec"
        common.write_trec(path, run, profile)
        out[f"ndcg10_{profile}"] = common.evaluate_trec(path, qrels)["nDCG@10"]
    shutil.rmtree(data / name, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------- synthetic

def centres(names) -> np.ndarray:
    parts = []
    for name in names:
        data = _vectors(name)
        if data is not None:
            parts.append(data[1])
    if not parts:
        raise SystemExit("no collection available for the synthetic corpus's centres")
    return np.concatenate(parts)


def train_part(args, cen) -> dict:
    out = {}
    for n in (10_000, 100_000):
        x = common.synthetic_vectors(cen, n, args.sigma, seed=n)
        art = SPARSE / "artifacts" / f"synthetic{n}-{args.dim}"
        seconds, meta = train_projector(x, args.dim, args.epochs, art, retrain=True)
        out[str(n)] = {"minutes": seconds / 60, "train_rows": meta["train_rows"],
                       "steps": meta["steps"]}
        console.print(f"[dim]trained on {n:,} synthetic docs: {seconds / 60:.1f} min[/dim]")
    return out


def synthetic_part(args, cen) -> dict:
    from polyindex.index.dense.kind import DenseKind
    n = args.synthetic
    x = common.synthetic_vectors(cen, n, args.sigma, seed=1)
    q = common.synthetic_vectors(cen, 200, args.sigma, seed=2)
    tmp = SPARSE / "tmp" / "synthetic"
    shutil.rmtree(tmp, ignore_errors=True)
    art = SPARSE / "artifacts" / f"synthetic100000-{args.dim}"
    if not art.exists():
        train_projector(common.synthetic_vectors(cen, 100_000, args.sigma, seed=100_000), args.dim,
                        args.epochs, art)
    dense = System(DenseKind("Flat"), x, tmp / "dense")
    _, truth, _ = dense.search(q, 10)
    out = {"docs": n, "queries": len(q), "sigma": args.sigma, "dense_bytes_per_doc": dense.bytes / n,
           # the folder's projector: the train part's (100,000 synthetic documents) unless
           # another was put there (issue 23's run: medline's, to bound the time)
           "projector": json.loads((art / "sparse.projector.json").read_text()).get("train_rows")}
    systems = sparse_systems(x, art, args, tmp)
    rows = []
    for (mode, k), sysm in systems.items():
        for v in variants(k, args):
            _, r, prep = sysm.search(q, 10, vparams(v))
            recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(r, truth)]))
            rows.append({"name": vname(mode, k, v), "mode": mode, "k": k, **v, "recall10": recall,
                         "postings": float(prep.touched.mean()), "bytes_per_doc": sysm.bytes / n})
    cands = dense_rates(dense, q, args.min_time)
    dense.one_at_a_time(q[:5])
    timed(cands, systems, q, args)
    samples = common.interleaved(cands, args.passes)
    out["dense_qps"] = median(samples["dense"])
    out["dense_qps_1thread"] = median(samples["dense-1t"])
    best = max(out["dense_qps"], out["dense_qps_1thread"])
    for r in rows:
        r["qps"] = median(samples[r["name"]])
        r["time_ratio_vs_dense"] = best / r["qps"]  # against the faster dense setting
    out["sparse"] = rows
    shutil.rmtree(tmp, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------- report

def report(results: dict, args) -> dict:
    for name, r in results.get("quality", {}).items():
        d = r["dense"]
        best = max(d["qps"], d["qps_1thread"])
        rows = [["dense flat", f"{d['ndcg10']:.4f}", "1.000", "-", "-", "-", "-",
                 f"{d['qps']:.0f}", f"{best / d['qps']:.2f}", f"{d['bytes_per_doc']:.0f}"],
                ["dense flat, 1 thread", "", "", "-", "-", "-", "-",
                 f"{d['qps_1thread']:.0f}", f"{best / d['qps_1thread']:.2f}", ""]]
        rows += [[e["name"], f"{e['ndcg10']:.4f}", f"{e['ndcg10'] / d['ndcg10']:.3f}",
                  f"{e['postings_exhaustive']:.0f}", f"{e['postings_pruned']:.0f}",
                  "yes" if e["pruned_same_topk"] else "NO", e["postings_total"],
                  f"{e['qps']:.0f}", f"{best / e['qps']:.2f}", f"{e['bytes_per_doc']:.0f}"]
                 for e in r["sparse"]]
        console.print(table(f"{name}: {r['docs']:,} docs, {r['queries']} queries, UHD{r['dim']}, "
                            f"projector trained in {r['train_s']:.0f}s",
                            ["system", "nDCG@10", "x dense", "postings/q exh", "MaxScore",
                             "same top-k", "postings", "q/s", "time x dense", "bytes/doc"], rows))
        ec = r["engine_check"]
        console.print(f"[dim]time x dense: per-query time / the faster dense flat setting. "
                      f"Engine collection ({ec['factory']}): profile sparse nDCG@10 "
                      f"{ec['ndcg10_sparse']:.4f}, dense {ec['ndcg10_dense']:.4f}[/dim]")
    s = results.get("synthetic")
    if s:
        rows = [[r["name"], f"{r['recall10']:.3f}", f"{r['postings']:.0f}", f"{r['qps']:.0f}",
                 f"{r['time_ratio_vs_dense']:.3f}", f"{r['bytes_per_doc']:.0f}"] for r in s["sparse"]]
        console.print(table(f"synthetic {s['docs']:,} docs (dense flat {s['dense_qps']:.1f} q/s, "
                            f"1 thread {s['dense_qps_1thread']:.1f} q/s, "
                            f"{s['dense_bytes_per_doc']:.0f} bytes/doc)",
                            ["sparse", "recall@10 vs dense", "postings/q", "q/s",
                             "time x dense", "bytes/doc"], rows))
    t = results.get("train")
    if t:
        console.print(table("projector training (CPU, 1 thread)", ["documents", "rows used", "steps",
                                                                   "minutes"],
                            [[n, v["train_rows"], v["steps"], f"{v['minutes']:.2f}"]
                             for n, v in t.items()]))
    return targets(results)


def targets(results: dict) -> dict:
    """Which variants meet every target at once."""
    q, s = results.get("quality", {}), results.get("synthetic")
    names = [e["name"] for e in next(iter(q.values()))["sparse"]] if q else \
        [e["name"] for e in (s or {}).get("sparse", [])]
    out = {}
    for name in names:
        checks = {}
        for coll, r in q.items():
            e = next(e for e in r["sparse"] if e["name"] == name)
            checks[f"{coll} nDCG>=0.97x"] = e["ndcg10"] >= 0.97 * r["dense"]["ndcg10"]
            if coll == "npl":  # against the faster dense setting
                best = max(r["dense"]["qps"], r["dense"]["qps_1thread"])
                checks["npl time<=1.0x"] = best <= e["qps"]
        if s:
            e = next(e for e in s["sparse"] if e["name"] == name)
            checks["synthetic time<=1/3"] = e["time_ratio_vs_dense"] <= 1 / 3
        out[name] = {"checks": checks, "pass": bool(checks) and all(checks.values())}
    rows = [[name, verdict(v["pass"]), ", ".join(c for c, ok in v["checks"].items() if not ok) or "-"]
            for name, v in out.items()]
    console.print(table("targets (all at once, per variant)", ["variant", "pass", "failed checks"],
                        rows))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collections", default="cranfield,nfcorpus,arguana,cisi,medline,npl")
    ap.add_argument("--parts", default="quality,synthetic,train")
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--rescore", type=int, default=400)
    ap.add_argument("--head-k", type=int, default=64,
                    help="doc k of the engine check and of the k_query variants")
    ap.add_argument("--head-kq", type=int, default=32, help="k_query of the engine check config")
    ap.add_argument("--ks", default="16,32,64,128",
                    help="document k of the indexes built (a subset of 16,32,64,128)")
    ap.add_argument("--no-binary", dest="binary", action="store_false",
                    help="float indexes only (the binary ones double the build and timing work)")
    ap.add_argument("--synthetic", type=int, default=200_000)
    ap.add_argument("--sigma", type=float, default=0.03)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--retrain", action="store_true",
                    help="train the collections' projectors even when saved ones match")
    ap.add_argument("--merge", action="store_true",
                    help="keep this D's parts (and collections) of the earlier result file")
    args = ap.parse_args()
    args.ks = tuple(int(k) for k in common.parse_list(args.ks))
    if not set(args.ks) <= set(KS):
        ap.error(f"--ks must be a subset of {KS}")
    import torch
    torch.set_num_threads(1)
    parts = common.parse_list(args.parts)
    names = common.parse_list(args.collections)
    path = common.RESULTS / "bench_sparse.json"
    runs = json.loads(path.read_text()).get("runs", {}) if path.exists() else {}
    key = f"UHD{args.dim}"
    results = {k: v for k, v in runs.get(key, {}).items()
               if k in ("quality", "synthetic", "train")} if args.merge else {}
    if "quality" in parts:
        results.setdefault("quality", {})
        for name in names:
            r = quality(name, args)
            if r is not None:
                results["quality"][name] = r
    if "synthetic" in parts or "train" in parts:
        cen = centres(names)
        if "train" in parts:
            results["train"] = train_part(args, cen)
        if "synthetic" in parts:
            results["synthetic"] = synthetic_part(args, cen)
    verdicts = report(results, args)
    runs[key] = {**results, "targets": verdicts, "args": vars(args)}
    common.save_results("bench_sparse", {"runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
