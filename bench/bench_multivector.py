"""The ``multivector`` kind (k-means codes + PQ residuals, PLAID-style search) vs exhaustive exact
float32 MaxSim over the same model's token embeddings.

Parts (``--parts quality,speed``; ``encode`` only fills the encoding cache):

- **quality**: per collection (cranfield, nfcorpus, arguana, cisi, medline, npl) the corpus and
  the judged queries are encoded once with the engine's token encoder (one forward pass: dense
  embedding, token embeddings, last-layer attention salience; cached under
  ``bench/.work/multivector/tokens``). An engine collection with ``lexical``, ``dense`` and
  ``multivector`` (default factory) is built from those encodings (``Writer.commit_segment``
  with tokens: the engine trains the codebook and builds the segment) and evaluated with
  ``polyindex eval`` (profiles multivector, hybrid-mv, hybrid, dense; ``--k 100``: the queries
  are encoded by the CLI itself). The reference is exhaustive exact MaxSim over the float32
  tokens (numpy/BLAS, special tokens dropped, L2-normalized, as the kind stores them). At the
  kind level, on the same cached query tokens: the default index (the engine's own segment),
  ``prune=0.5``, ``binary``, ``exhaustive=1`` (no candidate generation), and the pure-code
  modes ``KMeans256,residual=none`` (1-byte codes) and ``KMeans4096,residual=none``; nDCG@10
  (ir-measures on TREC runs, top 100), recall@100 against the exact top 100, bytes per token.
  arguana's queries are whole arguments (~250 tokens): its exact reference costs seconds per
  query, so it uses the first ``--arguana-queries`` judged queries (all systems alike).
- **speed**: npl and a generated corpus of ``--synthetic`` documents (token sets of real npl
  documents, at most 32 tokens, plus Gaussian noise ``--sigma`` per dimension, renormalized;
  npl's real query tokens): per-query search time one query at a time, k=100, query tokens
  precomputed (encoding excluded, the LUTs included), the default multivector index vs
  exhaustive exact MaxSim over float32 tokens with numpy/BLAS, alternated (ABBA, median of
  passes); recall@100 against the exact top 100.

Targets: storage <= 1/32 of float32 tokens (and pure-code KMeans256 <= 1.1 bytes/token);
multivector profile nDCG@10 >= 0.98 x exact MaxSim on every collection; time per query <= 0.5 x
exact on npl and on the generated corpus.

Usage: ``python bench/bench_multivector.py [--collections ...] [--parts quality,speed]
[--synthetic 100000] [--passes 3] [--threads 2]``
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

MV = WORK / "multivector"
K_EVAL = 100
DEFAULT = "KMeans4096,residual=OPQ32"


# ------------------------------------------------------------------------------ encodings

def encoded(name: str, te) -> dict | None:
    """Corpus + judged queries of a collection, encoded once (cached as .npz)."""
    from polyindex.index.protocol import DocTokens
    folder = common.collection_folder(name)
    if folder is None:
        return None
    corpus, qfile = common.corpus_file(folder), folder / "queries.jsonl"
    # content, not mtimes: a re-copied data folder must not cost a re-encode
    stamp = hashlib.sha1(corpus.read_bytes() + b"\0" + qfile.read_bytes()).hexdigest()
    key = hashlib.sha1(f"{stamp}:{te.name}:v2".encode()).hexdigest()[:12]
    path = MV / "tokens" / f"{name}.{key}.npz"
    ids, titles, texts = common.read_corpus(folder)
    qrels = common.read_qrels(folder)
    queries = common.judged(common.read_queries(folder), qrels)
    if not path.exists():
        console.print(f"[dim]{name}: encoding {len(ids):,} documents and {len(queries)} queries "
                      f"(tokens + salience, one forward pass) ...[/dim]")
        t0 = time.perf_counter()
        emb, toks = te.encode_documents([common.doc_text(a, b) for a, b in zip(titles, texts)],
                                        salience=True)
        qt = te.encode_queries([t for _, t in queries])
        secs = time.perf_counter() - t0
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, emb=emb, dlen=np.array([len(t.vectors) for t in toks]),
                 dvec=np.concatenate([t.vectors for t in toks]),
                 dspecial=np.concatenate([t.special for t in toks]),
                 dsal=np.concatenate([t.salience for t in toks]),
                 dids=np.concatenate([t.token_ids for t in toks]),
                 qlen=np.array([len(t.vectors) for t in qt]),
                 qvec=np.concatenate([t.vectors for t in qt]),
                 qspecial=np.concatenate([t.special for t in qt]),
                 seconds=np.array(secs))
    z = np.load(path)

    def split(prefix, n_key, with_extra):
        lens = z[n_key]
        off = np.concatenate([[0], np.cumsum(lens)])
        vec, sp = z[prefix + "vec"], z[prefix + "special"]
        sal = z["dsal"] if with_extra else None
        tid = z["dids"] if with_extra else None
        return [DocTokens(vec[a:b], sp[a:b], None if sal is None else sal[a:b],
                          None if tid is None else tid[a:b]) for a, b in zip(off[:-1], off[1:])]
    return {"name": name, "folder": folder, "ids": ids, "titles": titles, "texts": texts,
            "emb": z["emb"], "docs": split("d", "dlen", True), "qids": [q for q, _ in queries],
            "qtexts": [t for _, t in queries], "queries": split("q", "qlen", False),
            "qrels": qrels, "encode_s": float(z["seconds"])}


def subset_queries(data: dict, n: int | None) -> dict:
    if n is None or len(data["qids"]) <= n:
        return data
    return {**data, "qids": data["qids"][:n], "qtexts": data["qtexts"][:n],
            "queries": data["queries"][:n],
            "qrels": {q: data["qrels"][q] for q in data["qids"][:n]}}


# ------------------------------------------------------------------------------ reference

class Exact:
    """Exhaustive exact MaxSim over float32 tokens (special tokens dropped), numpy/BLAS."""

    CHUNK = 262_144  # token rows per matmul (bounds the score buffer)

    def __init__(self, docs):
        keep = [d.vectors[~d.special] for d in docs]
        lens = np.array([len(v) for v in keep])
        self.n = len(docs)
        self.x = np.ascontiguousarray(np.concatenate(keep), dtype=np.float32)
        self.rows = np.flatnonzero(lens > 0)
        starts = np.concatenate([[0], np.cumsum(lens)])[:-1][self.rows]
        # chunk boundaries on document starts
        self.chunks, a = [], 0
        while a < len(self.rows):
            b = int(np.searchsorted(starts, starts[a] + self.CHUNK, side="left"))
            b = max(b, a + 1)
            end = starts[b] if b < len(self.rows) else len(self.x)
            self.chunks.append((a, b, starts[a:b] - starts[a], starts[a], end))
            a = b
        self.tokens = len(self.x)

    def scores(self, q: np.ndarray) -> np.ndarray:
        out = np.full(self.n, -np.inf, np.float32)
        for a, b, rel, t0, t1 in self.chunks:
            s = self.x[t0:t1] @ q.T
            out[self.rows[a:b]] = np.maximum.reduceat(s, rel, axis=0).sum(1)
        return out

    def search(self, q: np.ndarray, k: int):
        s = self.scores(q)
        top = np.argpartition(-s, min(k, len(s)) - 1)[:k]
        top = top[np.lexsort((top, -s[top]))]
        return s[top], top


def read_exact(path: Path, data: dict):
    """The exact reference's run of an earlier bench run (TREC file + timing), or None."""
    meta = path.with_suffix(".json")
    if not path.exists() or not meta.exists():
        return None
    info = json.loads(meta.read_text())
    if info.get("queries") != len(data["qids"]):
        return None
    row = {d: i for i, d in enumerate(data["ids"])}
    got: dict = {}
    for line in path.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        got.setdefault(qid, ([], []))
        got[qid][0].append(float(score))
        got[qid][1].append(row[doc])
    if set(got) != set(data["qids"]):
        return None
    return ([(np.array(got[q][0], np.float32), np.array(got[q][1])) for q in data["qids"]],
            info["s_per_query"])


def drop_special(t) -> np.ndarray:
    return np.ascontiguousarray(t.vectors[~t.special], dtype=np.float32)


# ------------------------------------------------------------------------------ systems

class CachedAssign:
    """Assignments of the same token matrix to the same centroids are computed once."""
    memo: dict = {}

    @classmethod
    def install(cls, cb):
        orig = cb.assign

        def assign(x):
            h = hashlib.sha1(np.ascontiguousarray(x[::4099]).tobytes()).hexdigest()
            key = (hashlib.sha1(cb.centroids.tobytes()).hexdigest(), len(x), h)
            if key not in cls.memo:
                cls.memo[key] = orig(x)
            return cls.memo[key]
        cb.assign = assign
        return cb


def variant_codebook(base, *, k256=None, m: int | None = None, bits: int = 0):
    from polyindex.index.multivector import codec
    if k256 is not None:
        return CachedAssign.install(k256)
    if base is None:  # a variant not built in this run (--variants default)
        return None
    sig_proj, sig_mean = codec.signature_basis(base.centroids, bits)
    cb = codec.Codebook(base.centroids, base.pq_centroids if m else None, sig_proj, sig_mean,
                        {**base.meta, "m": m or 0, "bits_asked": bits},
                        base.rotation if m else None)
    return CachedAssign.install(cb)


class KindSystem:
    def __init__(self, kind, seg, info, label):
        self.kind, self.seg, self.info, self.label = kind, seg, info, label

    def search(self, qtok, k, params=None):
        from polyindex.index.protocol import Query
        prep = self.kind.prepare([Query(extra={"tokens": qtok})], [self.seg], [None],
                                 dict(params or {}), {})
        return self.seg.search(prep, k, {}, None), prep

    def bytes_per_token(self) -> dict:
        b = self.info["bytes"]
        tokens_in, stored = self.info["tokens_in"], self.info["tokens_stored"]
        codes = b["multivector.tokens.arrow"] + b.get("multivector.docs.arrow", 0)
        return {"codes_residuals_offsets": codes / max(tokens_in, 1),
                "per_stored_token": codes / max(stored, 1),
                "with_inverted_lists": (codes + b["multivector.ivf.arrow"]) / max(tokens_in, 1)}


def build_variant(body, cb, data, folder: Path) -> KindSystem:
    from polyindex.index.multivector.kind import MultivectorKind
    from polyindex.index.protocol import BuildBatch
    kind = MultivectorKind(body)
    kind.codebook = cb
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    n = len(data["ids"])
    info = kind.build(BuildBatch(data["ids"], [""] * n, [""] * n, None, data["docs"]), folder)
    return KindSystem(kind, kind.open(folder, info), info, body)


def run_ndcg(path: Path, results, ids, qids, qrels) -> float:
    run = {qid: [(ids[r], float(s)) for s, r in zip(ss, rr) if r >= 0]
           for qid, (ss, rr) in zip(qids, results)}
    common.write_trec(path, run, path.stem)
    return common.evaluate_trec(path, qrels)["nDCG@10"]


def recall(a, b) -> float:
    return float(np.mean([len(set(x[x >= 0].tolist()) & set(y.tolist())) / max(len(y), 1)
                          for x, y in zip(a, b)]))


# ------------------------------------------------------------------------------ engine

def engine_collection(data: dict, coll_dir: Path):
    """lexical + dense + multivector collection built from the cached encodings."""
    import polyindex
    from polyindex.types import Document
    shutil.rmtree(coll_dir, ignore_errors=True)
    eng = polyindex.open(coll_dir.parent)
    coll = eng.create_collection(coll_dir.name, ["lexical", "dense", f"multivector:{DEFAULT}"])
    docs = [Document(i, t, x, {}) for i, t, x in zip(data["ids"], data["titles"], data["texts"])]
    t0 = time.perf_counter()
    with coll.table.writer() as w:
        w.commit_segment(docs, {}, embeddings=data["emb"], tokens=data["docs"])
    coll.table.refresh()
    build_s = time.perf_counter() - t0
    return coll, build_s


def cli_eval(data: dict, coll_dir: Path) -> dict:
    qfile = MV / "queries" / f"{data['name']}.jsonl"
    qfile.parent.mkdir(parents=True, exist_ok=True)
    qfile.write_text("".join(json.dumps({"_id": q, "text": t}) + "\n"
                             for q, t in zip(data["qids"], data["qtexts"])))
    qrels = MV / "queries" / f"{data['name']}.qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{r}\n" for q in data["qids"] for d, r in data["qrels"][q].items()))
    out, wall = common.run_cli(["eval", "--data", coll_dir.parent, "--collection", coll_dir.name,
                                "--queries", qfile, "--qrels", qrels, "--k", K_EVAL,
                                "-p", "multivector", "-p", "hybrid-mv", "-p", "hybrid",
                                "-p", "dense", "--json"])
    return {"results": out["results"], "queries": out["queries"], "seconds": wall}


# ------------------------------------------------------------------------------ quality

def quality(name: str, te, args) -> dict | None:
    data = encoded(name, te)
    if data is None:
        return None
    data = subset_queries(data, args.arguana_queries if name == "arguana" else None)
    qtok = [drop_special(t) for t in data["queries"]]
    console.rule(f"{name}: {len(data['ids']):,} docs, {len(data['qids'])} judged queries")
    runs = MV / "runs" / name
    cached = read_exact(runs / "exact.trec", data)
    if cached is not None:  # the exact reference does not change between runs: reuse it
        ex, exact_s = cached
    else:
        exact = Exact(data["docs"])
        t0 = time.perf_counter()
        ex = [exact.search(q, K_EVAL) for q in qtok]
        exact_s = (time.perf_counter() - t0) / len(qtok)
        (runs / "exact.json").parent.mkdir(parents=True, exist_ok=True)
        (runs / "exact.json").write_text(json.dumps({"s_per_query": exact_s,
                                                     "queries": len(qtok)}))
    n_tokens = int(sum(int((~d.special).sum()) for d in data["docs"]))
    out = {"factory": DEFAULT, "docs": len(data["ids"]), "queries": len(data["qids"]),
           "tokens": n_tokens,
           "tokens_per_doc": n_tokens / len(data["ids"]), "encode_s": data["encode_s"],
           "exact": {"ndcg10": run_ndcg(runs / "exact.trec", ex, data["ids"], data["qids"],
                                        data["qrels"]), "s_per_query": exact_s}}
    truth = [r for _, r in ex]
    coll_dir = MV / "engine" / name
    coll, build_s = engine_collection(data, coll_dir)
    kind = coll.kinds["multivector"]
    snap = coll.view()
    entry = snap.manifest.segments[0]
    seg = snap.segments[0].indexes["multivector"]
    out["engine"] = {"build_s": build_s, "codebook": kind.codebook.meta,
                     "info": entry.indexes["multivector"]}
    out["engine"]["eval"] = cli_eval(data, coll_dir)
    base = KindSystem(kind, seg, entry.indexes["multivector"], DEFAULT)
    CachedAssign.install(kind.codebook)
    from polyindex.index.multivector import codec
    k256 = None
    if args.variants == "all":
        allt = np.concatenate([d.vectors[~d.special] for d in data["docs"]])  # float16
        k256 = codec.train(allt, 256, 0, seed=0)
        del allt
    tmp = MV / "tmp" / name
    systems = {DEFAULT: (base, {})}
    if args.variants == "all":
        systems[DEFAULT + " exhaustive=1"] = (base, {"exhaustive": "1"})
    for body, cb in ((DEFAULT + ",prune=0.5", variant_codebook(kind.codebook, m=kind.codebook.m)),
                     (DEFAULT + ",binary", variant_codebook(kind.codebook, m=kind.codebook.m,
                                                            bits=64)),
                     ("KMeans4096,residual=none", variant_codebook(kind.codebook, m=0)),
                     ("KMeans256,residual=none", variant_codebook(None, k256=k256))):
        if args.variants == "all":
            systems[body] = (build_variant(body, cb, data, tmp / body.replace(",", "_")), {})
    rows = []
    for label, (sysm, params) in systems.items():
        sysm.search(qtok[0], K_EVAL, params)  # warm-up (numba)
        t0 = time.perf_counter()
        res = []
        stats = {"candidates": 0, "final": 0}
        for q in qtok:
            r, prep = sysm.search(q, K_EVAL, params)
            res.append((r[0][0], r[1][0]))
            for key in stats:
                stats[key] += prep.stats[key]
        secs = (time.perf_counter() - t0) / len(qtok)
        fname = label.replace(",", "_").replace(" ", "_")
        e = {"name": label, "ndcg10": run_ndcg(runs / f"{fname}.trec", res, data["ids"],
                                                data["qids"], data["qrels"]),
             "recall100": recall([r for _, r in res], truth), "s_per_query": secs,
             "candidates_per_query": stats["candidates"] / len(qtok),
             "final_per_query": stats["final"] / len(qtok),
             "kept_fraction": sysm.info["kept_fraction"], "salience": sysm.info["salience"],
             **sysm.bytes_per_token()}
        e["vs_exact"] = e["ndcg10"] / out["exact"]["ndcg10"] if out["exact"]["ndcg10"] else None
        rows.append(e)
    out["kind"] = rows
    shutil.rmtree(tmp, ignore_errors=True)
    return out


# -------------------------------------------------------------------------------- speed

def synthetic_docs(templates, n: int, sigma: float, seed: int):
    from polyindex.index.protocol import DocTokens
    rng = np.random.default_rng(seed)
    pick = rng.integers(len(templates), size=n)
    out = []
    for i in pick:
        t = templates[i]
        v = t + sigma * rng.standard_normal(t.shape, dtype=np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out.append(DocTokens(v.astype(np.float16), np.zeros(len(v), bool)))
    return out


def timed(label, fn, qtok, min_time):
    def one():
        return common.rate(lambda: [fn(q) for q in qtok], len(qtok), min_time)
    return label, one


def speed_case(label: str, docs, qtok, args, kind_sys=None) -> dict:
    """Exact numpy/BLAS vs the multivector index, one query at a time, k=100."""
    exact = Exact(docs)
    out = {"docs": len(docs), "tokens": exact.tokens, "queries": len(qtok)}
    if kind_sys is None:
        # the generated documents are i.i.d.: the first 20k give a large enough sample
        from polyindex.index.multivector.kind import MultivectorKind
        from polyindex.index.protocol import BuildBatch
        t0 = time.perf_counter()
        trainer = MultivectorKind(DEFAULT)
        sample = docs[:20_000]
        trainer.train(BuildBatch([""] * len(sample), [""] * len(sample), [""] * len(sample),
                                 None, sample))
        cb = trainer.codebook
        out["train_s"] = time.perf_counter() - t0
        data = {"ids": [str(i) for i in range(len(docs))], "docs": docs}
        t0 = time.perf_counter()
        kind_sys = build_variant(DEFAULT, cb, data, MV / "tmp" / label)
        out["build_s"] = time.perf_counter() - t0
    truth = [exact.search(q, K_EVAL)[1] for q in qtok]
    got = [kind_sys.search(q, K_EVAL)[0][1][0] for q in qtok]
    out["recall100"] = recall(got, truth)
    out.update(kind_sys.bytes_per_token())
    cands = dict([timed("exact", lambda q: exact.search(q, K_EVAL), qtok, args.min_time),
                  timed("multivector", lambda q: kind_sys.search(q, K_EVAL), qtok, args.min_time)])
    samples = common.interleaved(cands, args.passes)
    out["qps"] = {k: median(v) for k, v in samples.items()}
    out["passes"] = samples
    out["ms_per_query"] = {k: 1000 / v for k, v in out["qps"].items()}
    out["time_ratio"] = out["qps"]["exact"] / out["qps"]["multivector"]
    shutil.rmtree(MV / "tmp" / label, ignore_errors=True)
    return out


def speed(te, args) -> dict:
    data = encoded("npl", te)
    if data is None:
        return {}
    qtok = [drop_special(t) for t in data["queries"]]
    out = {}
    coll_dir = MV / "engine" / "npl"
    sysm = None
    try:  # the quality part's engine collection, when it is there
        import polyindex
        coll = polyindex.open(coll_dir.parent).collection("npl")
        snap = coll.view()
        sysm = KindSystem(coll.kinds["multivector"], snap.segments[0].indexes["multivector"],
                          snap.manifest.segments[0].indexes["multivector"], DEFAULT)
    except Exception:  # noqa: BLE001 - build it at the kind level instead
        pass
    console.print("[dim]speed: npl[/dim]")
    out["npl"] = speed_case("npl", data["docs"], qtok, args, sysm)
    templates = [drop_special(d)[:32] for d in data["docs"] if (~d.special).sum()]
    console.print(f"[dim]speed: generating {args.synthetic:,} documents[/dim]")
    docs = synthetic_docs(templates, args.synthetic, args.sigma, seed=1)
    out["synthetic"] = speed_case("synthetic", docs, qtok, args)
    out["synthetic"]["sigma"] = args.sigma
    return out


# ------------------------------------------------------------------------------- report

def report(results: dict) -> dict:
    checks = {}
    for name, r in results.get("quality", {}).items():
        ev = r["engine"]["eval"]["results"]
        ex = r["exact"]["ndcg10"]
        rows = [["exact float32 MaxSim (numpy)", f"{ex:.4f}", "1.000", "1.000", "-", "-",
                 f"{1000 * r['exact']['s_per_query']:.1f}", "-"]]
        for p in ("multivector", "hybrid-mv", "hybrid", "dense"):
            rows.append([f"polyindex eval -p {p}", f"{ev[p]['nDCG@10']:.4f}",
                         f"{ev[p]['nDCG@10'] / ex:.3f}" if ex else "-", "", "", "", "", ""])
        for e in r["kind"]:
            rows.append([f"kind {e['name']}", f"{e['ndcg10']:.4f}", f"{e['vs_exact']:.3f}",
                         f"{e['recall100']:.3f}", f"{e['codes_residuals_offsets']:.2f}",
                         f"{e['kept_fraction']:.2f}", f"{1000 * e['s_per_query']:.1f}",
                         f"{e['candidates_per_query']:.0f}"])
        console.print(table(f"{name}: {r['docs']:,} docs, {r['tokens']:,} tokens "
                            f"({r['tokens_per_doc']:.0f}/doc), {r['queries']} queries",
                            ["system", "nDCG@10", "x exact", "R@100 vs exact", "bytes/token",
                             "kept", "ms/query", "candidates"], rows))
        checks[f"{name} profile nDCG>=0.98x exact"] = ev["multivector"]["nDCG@10"] >= 0.98 * ex
        default = r["kind"][0]  # the index under test (--factory) comes first
        pure = next((e for e in r["kind"] if e["name"] == "KMeans256,residual=none"), None)
        checks[f"{name} storage >=32x"] = default["codes_residuals_offsets"] <= 4 * 384 / 32
        if pure is not None:
            checks[f"{name} pure-code <=1.1 B/token"] = pure["codes_residuals_offsets"] <= 1.1
    for name, s in results.get("speed", {}).items():
        console.print(f"speed {name}: {s['docs']:,} docs, {s['tokens']:,} tokens: exact "
                      f"{s['ms_per_query']['exact']:.1f} ms/query, multivector "
                      f"{s['ms_per_query']['multivector']:.1f} ms/query (ratio "
                      f"{s['time_ratio']:.3f}), recall@100 vs exact {s['recall100']:.3f}, "
                      f"{s['codes_residuals_offsets']:.1f} bytes/token")
        checks[f"speed {name} <=0.5x exact"] = s["time_ratio"] <= 0.5
    console.print(table("targets", ["check", "pass"], [[k, verdict(v)] for k, v in checks.items()]))
    return checks


def main() -> int:
    global DEFAULT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collections", default="cranfield,nfcorpus,cisi,medline,npl,arguana")
    ap.add_argument("--parts", default="quality,speed")
    ap.add_argument("--arguana-queries", type=int, default=100)
    ap.add_argument("--synthetic", type=int, default=100_000)
    ap.add_argument("--sigma", type=float, default=0.02)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads while encoding")
    ap.add_argument("--merge", action="store_true", help="keep collections of the earlier result")
    ap.add_argument("--variants", default="all", choices=("all", "default"),
                    help="default: only the default index (and the engine eval)")
    ap.add_argument("--factory", default=DEFAULT,
                    help="the multivector index under test (factory body, e.g. "
                         "KMeans4096,residual=OPQ42_336)")
    args = ap.parse_args()
    DEFAULT = args.factory
    import torch
    torch.set_num_threads(args.threads)
    from polyindex.encode.tokens import get_token_encoder
    te = get_token_encoder("all-MiniLM-L6-v2")
    parts = common.parse_list(args.parts)
    path = common.RESULTS / "bench_multivector.json"
    old = json.loads(path.read_text()) if path.exists() and args.merge else {}
    results = {"quality": dict(old.get("quality", {})), "speed": dict(old.get("speed", {}))}
    if "encode" in parts:  # only fill the encoding cache
        for name in common.parse_list(args.collections):
            encoded(name, te)
    if "quality" in parts:
        for name in common.parse_list(args.collections):
            r = quality(name, te, args)
            if r is not None:
                results["quality"][name] = r
                common.save_results("bench_multivector", {**results, "args": vars(args)})
    if "speed" in parts:
        results["speed"] = speed(te, args)
    checks = report(results)
    common.save_results("bench_multivector", {**results, "targets": checks, "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
