"""The ``tree`` kind (Cobweb-style prototype tree) vs ``dense`` flat on the same embeddings.

Parts (``--parts quality,degraded,scaling,engine``):

- **quality**: per collection (cranfield, nfcorpus, arguana, cisi, medline, npl) the document
  embeddings (and titles/texts, for the node labels) are read from the engine collection
  bench_quality builds (``bench/.work/engine/<name>``; built with ``polyindex index`` under
  ``bench/.work/tree/engine`` when absent) and the judged test queries are encoded with the
  engine's encoder (cached under ``bench/.work/queries``). One tree per collection
  (``--factory``) is built at the kind level (``IndexKind`` protocol, one segment) beside
  ``dense`` flat (``DenseKind("Flat")``). nDCG@10 with ir-measures on TREC runs (top 100,
  judged queries) for best-first (``rank=best``) and path-sum (``rank=path``) at several node
  budgets (0 = unlimited), with mean nodes expanded per query.
- **degraded**: the same, on anisotropic embeddings: every document and query vector gets a
  large common component and noise, ``x' = x + shift * c + noise * g`` (c one random unit
  vector, g standard normal per dimension; not renormalized), for dense flat (dot product),
  exact flat L2 and flat cosine (references) and the tree with each ``--sims``.
- **scaling**: generated corpora (``--sizes``, default 10k, 100k, 1M) drawn from a mixture of
  Gaussians centred on the real document embeddings (sigma ``--sigma`` per dimension,
  normalized): build time (tree, and writing ``docs.arrow``), index bytes, peak memory growth
  during the build (VmHWM), one-query-at-a-time latency at a fixed node budget
  (``--scale-budget``) with recall@10 against flat, and dense flat latency on the same
  corpus; the exponent of latency vs corpus size (sublinear: < 1).
- **engine**: the CLI end to end on ``--engine-collections`` (default cranfield):
  ``polyindex index --index lexical --index dense --index <factory>`` (encodes the corpus), then
  ``polyindex eval`` with the profiles dense, tree, hybrid and hybrid-tree.

Targets (fixed configurations): nDCG@10 >= 0.97 x dense flat on every collection for
best-first (``sim=cos``, 256 nodes) and path-sum (``sim=dot``, default temp, unlimited budget);
degraded: the kind's default (``sim=cos`` best-first, 64 nodes) beats flat dot product;
scaling: latency exponent < 1.

Usage: ``python bench/bench_tree.py [--parts quality,degraded,scaling] [--collections ...]
[--factory tree:branch=16,leaf=64] [--sizes 10000,100000,1000000] [--merge]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from common import WORK, console, table, verdict

TREE = WORK / "tree"
COLLECTIONS = "cranfield,nfcorpus,arguana,cisi,medline,npl"
HEAD_K = 10
HEAD_BUDGET = 256  # the node budget of the quality target for best-first


# ------------------------------------------------------------------------------ systems

class System:
    """One kind over one set of vectors, built and opened at the kind level."""

    def __init__(self, kind, x, folder: Path, titles=None, texts=None, docs_from: Path | None = None):
        import os

        from polyindex.index.protocol import BuildBatch
        from polyindex.storage.segment import Segment, write_docs
        from polyindex.types import Document
        folder.mkdir(parents=True, exist_ok=True)
        n = len(x)
        ids = [str(i) for i in range(n)]
        titles = titles or [""] * n
        texts = texts or [""] * n
        if docs_from is not None:  # the same documents: link the file
            os.link(docs_from / "docs.arrow", folder / "docs.arrow")
        else:
            write_docs(folder, [Document(i, "", "", {}) for i in ids], {}, x)
        t0 = time.perf_counter()
        self.info = kind.build(BuildBatch(ids, titles, texts, x), folder)
        self.build_s = time.perf_counter() - t0
        self.kind, self.seg = kind, kind.open(folder, self.info, Segment(folder, "s", len(ids)))
        self.bytes = sum((folder / f).stat().st_size for f in self.info["files"])

    def search(self, q, k, params=None):
        from polyindex.index.protocol import Query
        prepared = self.kind.prepare([Query(vector=v) for v in q], [self.seg], [None],
                                     dict(params or {}), {})
        scores, rows = self.seg.search(prepared, k, {}, None)
        return scores, rows, prepared


def trec_ndcg(path: Path, rows, scores, ids, qids, qrels) -> float:
    run = {qid: [(ids[r], float(s)) for r, s in zip(rr, ss) if r >= 0]
           for qid, rr, ss in zip(qids, rows, scores)}
    common.write_trec(path, run, path.stem)
    return common.evaluate_trec(path, qrels)["nDCG@10"]


def per_query_ms(sysm: System, q, params, k=HEAD_K, min_time=0.5) -> float:
    sysm.search(q[:3], k, params)  # warm-up (numba, caches)
    rate = common.rate(lambda: [sysm.search(q[i:i + 1], k, params) for i in range(len(q))],
                       len(q), min_time)
    return 1000.0 / rate


def variants(args) -> list[dict]:
    out = []
    for rank, budgets in (("best", args.budgets), ("path", args.path_budgets)):
        for b in common.parse_list(budgets):
            out.append({"rank": rank, "budget": str(int(b))})
    return out


def run_variants(name, tag, tree: System, ids, qids, q, qrels, extra: dict, args) -> list[dict]:
    rows = []
    runs = TREE / "runs" / name
    for v in variants(args):
        params = {**v, **extra}
        s, r, prep = tree.search(q, 100, params)
        label = f"{tag} {v['rank']} budget={v['budget']}"
        e = {"name": label, **params, "expanded": float(prep.expanded.mean()),
             "ndcg10": trec_ndcg(runs / f"{label.replace(' ', '_')}.trec", r, s, ids, qids, qrels)}
        rows.append(e)
    return rows


# ------------------------------------------------------------------------------ quality

def quality(name: str, args) -> dict | None:
    from polyindex.index.dense.kind import DenseKind
    from polyindex.index.registry import from_factory
    data = common.stored_collection(name, TREE / "engine")
    if data is None:
        return None
    ids, titles, texts, x, qids, q, qrels = data
    console.rule(f"{name}: {len(ids):,} docs, {len(qids)} judged queries")
    tmp = TREE / "tmp" / name
    shutil.rmtree(tmp, ignore_errors=True)
    dense = System(DenseKind("Flat"), x, tmp / "dense")
    s, r, _ = dense.search(q, 100)
    out = {"docs": len(ids), "queries": len(qids), "factory": args.factory,
           "dense": {"ndcg10": trec_ndcg(TREE / "runs" / name / "dense.trec", r, s, ids, qids,
                                         qrels)}}
    tree = System(from_factory(args.factory), x, tmp / "tree", titles, texts, tmp / "dense")
    out["tree_build"] = {"seconds": tree.build_s, "bytes_per_doc": tree.bytes / len(ids),
                         **{k: v for k, v in tree.info.items() if k != "files"}}
    out["tree"] = []
    for sim in common.parse_list(args.sims):
        out["tree"] += run_variants(name, f"tree sim={sim}", tree, ids, qids, q, qrels,
                                    {"sim": sim}, args)
    if args.timing:
        out["dense"]["ms_per_query"] = per_query_ms(dense, q, {})
        for e in out["tree"]:
            e["ms_per_query"] = per_query_ms(tree, q, {"rank": e["rank"], "budget": e["budget"],
                                                       "sim": e["sim"]})
    out["labels_sample"] = _label_sample(tree.seg)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def _label_sample(seg, n=6) -> list[dict]:
    """The root's children: size and label (what the explanations look like)."""
    kids = range(int(seg.child_start[0]), int(seg.child_start[0] + seg.n_child[0]))
    return [{"node": int(i), "docs": int(seg.count[i]), "label": seg.labels[i].as_py()}
            for i in list(kids)[:n]]


# ----------------------------------------------------------------------------- degraded

def degrade(x: np.ndarray, c: np.ndarray, shift: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(x.shape).astype(np.float32)
    return np.ascontiguousarray(x + shift * c[None, :] + noise * g, np.float32)


def degraded(name: str, args) -> dict | None:
    from polyindex.index.dense.kind import DenseKind
    from polyindex.index.registry import from_factory
    data = common.stored_collection(name, TREE / "engine")
    if data is None:
        return None
    ids, titles, texts, x, qids, q, qrels = data
    console.rule(f"{name} (degraded: shift {args.shift}, noise {args.noise})")
    c = np.random.default_rng(12345).standard_normal(x.shape[1]).astype(np.float32)
    c /= np.linalg.norm(c)
    xd = degrade(x, c, args.shift, args.noise, seed=1)
    qd = degrade(q, c, args.shift, args.noise, seed=2)
    tmp = TREE / "tmp" / f"{name}-degraded"
    shutil.rmtree(tmp, ignore_errors=True)
    runs = TREE / "runs" / f"{name}-degraded"
    dense = System(DenseKind("Flat"), xd, tmp / "dense")
    s, r, _ = dense.search(qd, 100)
    out = {"docs": len(ids), "queries": len(qids), "shift": args.shift, "noise": args.noise,
           "dense_dot": trec_ndcg(runs / "dense.trec", r, s, ids, qids, qrels)}
    # flat L2 (reference): -||q - x||^2, exact
    d2 = -((qd ** 2).sum(1)[:, None] - 2.0 * qd @ xd.T + (xd ** 2).sum(1)[None, :])
    top = np.argsort(-d2, axis=1)[:, :100]
    out["flat_l2"] = trec_ndcg(runs / "flat_l2.trec", top, np.take_along_axis(d2, top, 1), ids,
                               qids, qrels)
    cos = (qd / np.linalg.norm(qd, axis=1, keepdims=True)) @ \
        (xd / np.linalg.norm(xd, axis=1, keepdims=True)).T
    top = np.argsort(-cos, axis=1)[:, :100]
    out["flat_cos"] = trec_ndcg(runs / "flat_cos.trec", top, np.take_along_axis(cos, top, 1), ids,
                                qids, qrels)
    tree = System(from_factory(args.factory), xd, tmp / "tree", titles, texts, tmp / "dense")
    out["tree"] = []
    for sim in common.parse_list(args.sims):
        out["tree"] += run_variants(f"{name}-degraded", f"tree sim={sim}", tree, ids, qids, qd,
                                    qrels, {"sim": sim}, args)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------ scaling

def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def scale_one(n: int, cen: np.ndarray, q: np.ndarray, args) -> dict:
    """Build a tree over n generated documents; time it, size it, query it."""
    import faiss

    from polyindex.index.protocol import BuildBatch, Query

    from polyindex.index.registry import from_factory
    from polyindex.storage.segment import Segment, write_docs
    from polyindex.types import Document
    console.rule(f"scaling: {n:,} generated documents")
    x = common.synthetic_vectors(cen, n, args.sigma, seed=n)
    tmp = TREE / "tmp" / f"scale-{n}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    write_docs(tmp, [Document(str(i), "", "", {}) for i in range(n)], {}, x)
    docs_s = time.perf_counter() - t0
    kind = from_factory(args.factory)
    base = _rss_kib("VmRSS")
    peak_ok = _reset_peak()
    t0 = time.perf_counter()
    info = kind.build(BuildBatch([""] * n, [""] * n, [""] * n, x), tmp)
    build_s = time.perf_counter() - t0
    peak = _rss_kib("VmHWM") - base if peak_ok else None
    seg = kind.open(tmp, info, Segment(tmp, "s", n))
    index_bytes = sum((tmp / f).stat().st_size for f in info["files"])
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    _, truth = flat.search(q, HEAD_K)

    def search(qs, params):
        prep = kind.prepare([Query(vector=v) for v in qs], [seg], [None], params, {})
        return seg.search(prep, HEAD_K, {}, None), prep

    def ms_per_query(fn) -> float:
        fn(q[:3])  # warm-up
        return 1000.0 / common.rate(lambda: [fn(q[i:i + 1]) for i in range(len(q))], len(q),
                                    args.min_time)
    best = {"budget": str(args.scale_budget)}
    path = {**best, "rank": "path"}
    (_, rows), prep = search(q, best)
    e = {"docs": n, "build_s": build_s, "docs_arrow_s": docs_s, "index_bytes": index_bytes,
         "build_peak_mib": None if peak is None else peak / 1024,
         "vectors_mib": x.nbytes / 2**20, "n_nodes": info["n_nodes"], "depth": info["depth"],
         "ops": info["ops"], "expanded": float(prep.expanded.mean()),
         "recall10_best": float(np.mean([len(set(a) & set(b)) / HEAD_K
                                         for a, b in zip(rows, truth)])),
         "best_ms": ms_per_query(lambda qs: search(qs, best)),
         "path_ms": ms_per_query(lambda qs: search(qs, path)),
         "flat_ms": ms_per_query(lambda qs: flat.search(qs, HEAD_K))}
    console.print(e)
    shutil.rmtree(tmp, ignore_errors=True)
    return e


def scaling(args, names) -> dict:
    parts = []
    for name in names:
        data = common.stored_collection(name, TREE / "engine")
        if data is not None:
            parts.append(data[3])
    if not parts:
        raise SystemExit("no collection available for the synthetic corpus's centres")
    cen = np.concatenate(parts)
    q = common.synthetic_vectors(cen, args.scale_queries, args.sigma, seed=2)
    out = {"sigma": args.sigma, "centres": len(cen), "budget": args.scale_budget,
           "factory": args.factory, "queries": len(q),
           "sizes": [scale_one(int(n), cen, q, args) for n in common.parse_list(args.sizes)]}
    s = out["sizes"]
    if len(s) >= 2:
        ln = np.log([e["docs"] for e in s])
        for key in ("best_ms", "path_ms", "flat_ms"):
            out[f"exponent_{key}"] = float(np.polyfit(ln, np.log([e[key] for e in s]), 1)[0])
    return out


# ------------------------------------------------------------------------------- engine

def engine_part(name: str, args) -> dict | None:
    """The CLI path end to end: ``polyindex index --index lexical --index dense --index
    <factory>`` then ``polyindex eval`` with the profiles dense, tree, hybrid and hybrid-tree
    (this encodes the corpus again: the slow part)."""
    folder = common.collection_folder(name)
    if folder is None:
        return None
    data = TREE / "engine-check"
    shutil.rmtree(data / name, ignore_errors=True)
    console.rule(f"engine check: {name} with --index {args.factory}")
    report, index_s = common.run_cli(["index", folder, "--data", data, "--collection", name,
                                      "--index", "lexical", "--index", "dense", "--index",
                                      args.factory, "--no-progress", "--json"])
    profiles = ["dense", "tree", "hybrid", "hybrid-tree"]
    args_eval = ["eval", "--data", data, "--collection", name, "--queries",
                 folder / "queries.jsonl", "--qrels", folder / "qrels" / "test.tsv", "--k", "100",
                 "--json"]
    for p in profiles:
        args_eval += ["--profile", p]
    res, eval_s = common.run_cli(args_eval)
    shutil.rmtree(data / name, ignore_errors=True)
    return {"factory": args.factory, "index_s": index_s, "eval_s": eval_s,
            "documents": report.get("documents"),
            "ndcg10": {p: r["nDCG@10"] for p, r in res["results"].items()}}


# ------------------------------------------------------------------------------- report

def report(results: dict, args) -> dict:
    checks = {}
    for name, r in results.get("quality", {}).items():
        d = r["dense"]["ndcg10"]
        rows = [["dense flat", f"{d:.4f}", "1.000", "-",
                 f"{r['dense'].get('ms_per_query', float('nan')):.2f}"]]
        rows += [[e["name"], f"{e['ndcg10']:.4f}", f"{e['ndcg10'] / d:.3f}",
                  f"{e['expanded']:.0f}", f"{e.get('ms_per_query', float('nan')):.2f}"]
                 for e in r["tree"]]
        b = r["tree_build"]
        console.print(table(f"{name}: {r['docs']:,} docs, {r['queries']} queries, {r['factory']} "
                            f"({b['n_nodes']} nodes, depth {b['depth']}, built in "
                            f"{b['seconds']:.1f}s)",
                            ["system", "nDCG@10", "x dense", "nodes opened/q", "ms/q"], rows))
        # fixed configurations (not the best of the grid): best-first with the default
        # similarity at a limited budget (unlimited, it is flat search by definition), and
        # the path-sum rule itself (dot, default temp, unlimited budget: exact top-k)
        fixed = ((f"best-first cos, {HEAD_BUDGET} nodes", f"tree sim=cos best budget={HEAD_BUDGET}"),
                 ("path-sum dot, unlimited", "tree sim=dot path budget=0"))
        for label, want in fixed:
            e = next((e for e in r["tree"] if e["name"] == want), None)
            if e is not None:
                checks[f"{name} {label} >= 0.97x dense"] = e["ndcg10"] >= 0.97 * d
    for name, r in results.get("degraded", {}).items():
        rows = [["dense flat (dot)", f"{r['dense_dot']:.4f}", "1.000", "-"],
                ["flat L2 (reference)", f"{r['flat_l2']:.4f}",
                 f"{r['flat_l2'] / max(r['dense_dot'], 1e-9):.3f}", "-"],
                ["flat cosine (reference)", f"{r['flat_cos']:.4f}",
                 f"{r['flat_cos'] / max(r['dense_dot'], 1e-9):.3f}", "-"]]
        rows += [[e["name"], f"{e['ndcg10']:.4f}", f"{e['ndcg10'] / max(r['dense_dot'], 1e-9):.3f}",
                  f"{e['expanded']:.0f}"] for e in r["tree"]]
        console.print(table(f"{name} degraded (x + {r['shift']} c + {r['noise']} noise)",
                            ["system", "nDCG@10", "x dense dot", "nodes opened/q"], rows))
        e = next((e for e in r["tree"] if e["name"] == "tree sim=cos best budget=64"), None)
        if e is not None:  # the default configuration of the kind
            checks[f"{name} degraded: tree (cos, 64 nodes) > flat dot"] = \
                e["ndcg10"] > r["dense_dot"]
    s = results.get("scaling")
    if s:
        rows = [[f"{e['docs']:,}", f"{e['build_s']:.1f}", f"{e['index_bytes'] / 2**20:.1f}",
                 "-" if e["build_peak_mib"] is None else f"{e['build_peak_mib']:.0f}",
                 e["n_nodes"], e["depth"], f"{e['best_ms']:.2f}", f"{e['path_ms']:.2f}",
                 f"{e['recall10_best']:.3f}", f"{e['flat_ms']:.2f}"] for e in s["sizes"]]
        console.print(table(f"scaling ({s['factory']}, budget {s['budget']} nodes, k={HEAD_K}, "
                            f"one query at a time)",
                            ["docs", "build s", "index MiB", "build peak MiB", "nodes", "depth",
                             "best ms/q", "path ms/q", "recall@10 vs flat", "flat ms/q"], rows))
        if "exponent_best_ms" in s:
            console.print(f"latency ~ N^{s['exponent_best_ms']:.2f} (best), "
                          f"N^{s['exponent_path_ms']:.2f} (path); flat N^{s['exponent_flat_ms']:.2f}")
            checks["scaling: best latency sublinear"] = s["exponent_best_ms"] < 1.0
            checks["scaling: path latency sublinear"] = s["exponent_path_ms"] < 1.0
    for name, r in results.get("engine", {}).items():
        console.print(table(f"engine check {name}: polyindex index --index lexical --index dense "
                            f"--index {r['factory']} ({r['index_s']:.0f}s), polyindex eval",
                            ["profile", "nDCG@10"],
                            [[p, f"{v:.4f}"] for p, v in r["ndcg10"].items()]))
    console.print(table("targets", ["check", "pass"], [[k, verdict(v)] for k, v in checks.items()]))
    return checks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collections", default=COLLECTIONS)
    ap.add_argument("--parts", default="quality,degraded,scaling,engine")
    ap.add_argument("--engine-collections", default="cranfield",
                    help="collections of the engine part (indexed with the CLI)")
    ap.add_argument("--factory", default="tree:branch=16,leaf=64")
    ap.add_argument("--budgets", default="16,64,128,256,0", help="best-first node budgets")
    ap.add_argument("--path-budgets", default="64,128,256,0", help="path-sum node budgets")
    ap.add_argument("--sims", default="dot,cos,gauss", help="node similarities measured")
    ap.add_argument("--shift", type=float, default=4.0)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--sigma", type=float, default=0.03)
    ap.add_argument("--scale-budget", type=int, default=64)
    ap.add_argument("--scale-queries", type=int, default=200)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--timing", action="store_true", help="also time the quality variants")
    ap.add_argument("--merge", action="store_true", help="keep parts/collections not rerun")
    args = ap.parse_args()
    parts = common.parse_list(args.parts)
    names = common.parse_list(args.collections)
    path = common.RESULTS / "bench_tree.json"
    old = json.loads(path.read_text()) if path.exists() and args.merge else {}
    results = {k: old[k] for k in ("quality", "degraded", "scaling", "engine") if k in old}
    for part, fn in (("quality", quality), ("degraded", degraded)):
        if part in parts:
            results.setdefault(part, {})
            for name in names:
                r = fn(name, args)
                if r is not None:
                    results[part][name] = r
    if "engine" in parts:
        results.setdefault("engine", {})
        for name in common.parse_list(args.engine_collections):
            r = engine_part(name, args)
            if r is not None:
                results["engine"][name] = r
    if "scaling" in parts:
        results["scaling"] = scaling(args, names)
    checks = report(results, args)
    common.save_results("bench_tree", {**results, "targets": checks, "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
