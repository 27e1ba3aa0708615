"""Speed of the engine as ratios against reference implementations, same run, same machine.

What it measures (every ratio = engine rate / reference rate, higher is better; measurements
alternate engine and reference in ABBA order, each the median of ``--passes`` passes, after a
warm-up pass):

(a) lexical queries/s, one query at a time, npl (11,429 docs, 93 queries), k=10:
    ``coll.query(text, k=10, profile="lexical")`` vs bm25s (``BM25(k1=1.5, b=0.75,
    method="lucene")``, PyStemmer english, the engine's stopwords) tokenizing one query with
    ``bm25s.tokenize`` and ``retrieve(k=10, show_progress=False)``.
    Target: ratio >= 1.0. Also reported (no target): bm25s with pre-tokenized queries, and
    bm25s's numba backend.
(b) dense search with precomputed query vectors, npl, k=10: ``coll.query(vector=v, ...,
    profile="dense")`` one at a time and ``coll.query_batch(vectors=V, ...)`` batched vs raw
    FAISS ``IndexFlatIP.search`` over the same stored embeddings (read from the engine's
    segments), one at a time and batched. Target: ratio >= 0.9 (both).
(c) bulk indexing docs/s, npl (11,429 short docs) and nfcorpus (3,395 longer docs):
    in-process ``Engine(...).create_collection(name).index(folder)`` into a fresh collection
    (lexical + dense: reading, encoding, lexical build, Arrow/FAISS writes, commit) vs raw
    sentence-transformers ``model.encode(texts, batch_size=64, normalize_embeddings=True)``
    in bf16 on the same texts; model loading excluded from both, after an untimed warm-up
    encode of the same texts. Target: ratio >= 0.85.

The engine collection for (a)/(b) is the one bench_quality builds (``bench/.work/engine/npl``,
built here if missing; ``--fresh`` rebuilds it). Run this when the machine is otherwise idle:
CPU contention from other processes makes single measurements noisy (the ABBA order and
medians only reduce that).

Usage: ``python bench/bench_speed.py [--parts a,b,c] [--passes 5] [--min-time 1.0]
[--index-passes 3] [--index-collections npl,nfcorpus] [--torch-threads N] [--collection npl]
[--fresh]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ENGINE_DATA, WORK, console, median, table, verdict  # noqa: E402

SPEED = WORK / "speed"
QUERY_COLLECTION = "npl"
K = 10
TARGETS = {"lexical": 1.0, "dense": 0.9, "index": 0.85}


def _summary(samples: dict[str, list[float]]) -> dict:
    return {name: {"median": median(xs), "passes": xs} for name, xs in samples.items()}


# ------------------------------------------------------------------------------ (a) lexical

def part_lexical(coll, ids, doc_texts, queries, passes: int, min_time: float) -> dict:
    import bm25s
    import Stemmer
    sw = common.stopwords()
    stemmer = Stemmer.Stemmer("english")
    retr = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retr.index(bm25s.tokenize(doc_texts, stopwords=sw, stemmer=stemmer, show_progress=False),
               show_progress=False)
    retr_nb = bm25s.BM25(k1=1.5, b=0.75, method="lucene", backend="numba")
    retr_nb.index(bm25s.tokenize(doc_texts, stopwords=sw, stemmer=stemmer, show_progress=False),
                  show_progress=False)
    pre = bm25s.tokenize([t for _, t in queries], stopwords=sw, stemmer=stemmer,
                         return_ids=False, show_progress=False)
    keep = [i for i, toks in enumerate(pre) if toks]  # bm25s fails on an empty query
    texts = [queries[i][1] for i in keep]
    pre = [pre[i] for i in keep]
    n = len(texts)

    def engine():
        for t in texts:
            coll.query(t, k=K, profile="lexical")

    def bm25s_tok():
        for t in texts:
            retr.retrieve(bm25s.tokenize(t, stopwords=sw, stemmer=stemmer, show_progress=False),
                          k=K, show_progress=False)

    def bm25s_pre():
        for toks in pre:
            retr.retrieve([toks], k=K, show_progress=False)

    def bm25s_numba():
        for t in texts:
            retr_nb.retrieve(bm25s.tokenize(t, stopwords=sw, stemmer=stemmer, show_progress=False),
                             k=K, show_progress=False)

    fns = {"engine": engine, "bm25s": bm25s_tok, "bm25s_pretokenized": bm25s_pre,
           "bm25s_numba": bm25s_numba}
    for fn in fns.values():  # warm-up (JIT, caches)
        fn()
    # Agreement of the top-10 ids (sanity: the same BM25 up to tokenizer differences).
    agree = 0
    for t in texts:
        e = [h.id for h in coll.query(t, k=K, profile="lexical")]
        docs, scores = retr.retrieve(bm25s.tokenize(t, stopwords=sw, stemmer=stemmer,
                                                    show_progress=False), k=K, show_progress=False)
        b = [ids[d] for d, s in zip(docs[0], scores[0]) if s > 0]
        agree += len(set(e) & set(b)) / max(len(b), 1)
    samples = common.interleaved({name: (lambda fn=fn: common.rate(fn, n, min_time))
                                  for name, fn in fns.items()}, passes)
    s = _summary(samples)
    base = s["engine"]["median"]
    return {"queries": n, "qps": s,
            "ratio": {"vs_bm25s": base / s["bm25s"]["median"],
                      "vs_bm25s_pretokenized": base / s["bm25s_pretokenized"]["median"],
                      "vs_bm25s_numba": base / s["bm25s_numba"]["median"]},
            "top10_overlap_with_bm25s": agree / n}


# -------------------------------------------------------------------------------- (b) dense

def stored_embeddings(folder: Path):
    """The embeddings the engine stored, in global row order (segments in manifest order)."""
    import numpy as np
    import pyarrow as pa
    manifest = json.loads((folder / "manifest.json").read_text())
    parts = []
    for seg in manifest["segments"]:
        tbl = pa.ipc.open_file(pa.memory_map(str(folder / "segments" / seg["id"] / "docs.arrow"))
                               ).read_all()
        col = tbl.column("embedding").combine_chunks()
        parts.append((tbl.column("id").to_pylist(),
                      col.values.to_numpy(zero_copy_only=False).reshape(len(col), -1)))
        if seg.get("n_deleted"):
            raise RuntimeError("the bench collection has deletions; rebuild it with --fresh")
    return [i for p in parts for i in p[0]], np.ascontiguousarray(np.concatenate([p[1] for p in parts]),
                                                                  dtype=np.float32)


def part_dense(coll, queries, passes: int, min_time: float) -> dict:
    import faiss
    import numpy as np

    from polyindex.encode.text import get_encoder
    texts = [t for _, t in queries]
    V = get_encoder(coll.config.model, coll.config.dtype).encode(texts)
    V = np.ascontiguousarray(V, dtype=np.float32)
    row_ids, emb = stored_embeddings(coll.folder)
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(emb)
    n = len(V)
    singles = [np.ascontiguousarray(V[i:i + 1]) for i in range(n)]

    def engine_one():
        for v in V:
            coll.query(vector=v, k=K, profile="dense")

    def faiss_one():
        for v in singles:
            index.search(v, K)

    def engine_batch():
        coll.query_batch(vectors=V, k=K, profile="dense")

    def faiss_batch():
        index.search(V, K)

    for fn in (engine_one, faiss_one, engine_batch, faiss_batch):
        fn()
    # Sanity: same top-10 ids.
    _, rows = index.search(V, K)
    hits = coll.query_batch(vectors=V, k=K, profile="dense")
    same = sum([h.id for h in hs] == [row_ids[r] for r in rows[i]] for i, hs in enumerate(hits))
    one = common.interleaved({"engine": lambda: common.rate(engine_one, n, min_time),
                              "faiss": lambda: common.rate(faiss_one, n, min_time)}, passes)
    bat = common.interleaved({"engine": lambda: common.rate(engine_batch, n, min_time),
                              "faiss": lambda: common.rate(faiss_batch, n, min_time)}, passes)
    s1, s2 = _summary(one), _summary(bat)
    return {"queries": n, "rows": int(index.ntotal), "faiss_omp_threads": faiss.omp_get_max_threads(),
            "one_at_a_time_qps": s1, "batched_qps": s2,
            "ratio": {"one_at_a_time": s1["engine"]["median"] / s1["faiss"]["median"],
                      "batched": s2["engine"]["median"] / s2["faiss"]["median"]},
            "identical_top10_queries": f"{same}/{n}"}


# ----------------------------------------------------------------------------- (c) indexing

def part_index(names: list[str], passes: int) -> list[dict]:
    from polyindex.encode.text import get_encoder
    from polyindex.engine import Engine
    model = common.load_st_model()
    get_encoder()  # the engine's encoder, loaded once per process (excluded from timing)
    SPEED.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        folder = common.collection_folder(name)
        if folder is None:
            continue
        _, titles, texts = common.read_corpus(folder)
        doc_texts = [common.doc_text(ti, te) for ti, te in zip(titles, texts)]
        n = len(doc_texts)
        data = SPEED / "data"
        shutil.rmtree(data, ignore_errors=True)
        eng = Engine(data)
        # Warm-up, untimed: one full raw encode of the same texts (oneDNN builds its bf16
        # kernels per (batch, padded length) shape, once per process, for both sides) and the
        # engine's write path once on a sample.
        common.st_encode(model, doc_texts)
        eng.create_collection("warmup").add(
            [{"_id": str(i), "text": t} for i, t in enumerate(doc_texts[:256])])
        eng.drop_collection("warmup")
        counter = [0]

        def engine_pass():
            counter[0] += 1
            coll = eng.create_collection(f"{name}-{counter[0]}")
            t0 = time.perf_counter()
            report = coll.index(folder, progress=False)
            secs = time.perf_counter() - t0
            assert report.indexed == n and coll.count() == n, (report, coll.count())
            eng.drop_collection(coll.name)
            return n / secs

        def raw_pass():
            t0 = time.perf_counter()
            common.st_encode(model, doc_texts)
            return n / (time.perf_counter() - t0)

        console.print(f"[dim]bulk indexing {name}: {n:,} docs x {passes} pass(es) each ...[/dim]")
        s = _summary(common.interleaved({"engine": engine_pass, "raw_encode": raw_pass}, passes))
        shutil.rmtree(data, ignore_errors=True)
        out.append({"collection": name, "documents": n,
                    "mean_chars": sum(map(len, doc_texts)) / n, "docs_per_s": s,
                    "ratio": s["engine"]["median"] / s["raw_encode"]["median"]})
    return out


# ------------------------------------------------------------------------------------ main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="a,b,c", help="which parts to run: a (lexical), "
                    "b (dense), c (bulk indexing); default a,b,c")
    ap.add_argument("--passes", type=int, default=5, help="passes per query measurement")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="seconds per query measurement (repeats the query set)")
    ap.add_argument("--index-passes", type=int, default=3, help="passes per bulk-index measurement")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch.set_num_threads for both sides of (c) (default: torch's own, "
                         "one per core); 1 is far less sensitive to other busy processes")
    ap.add_argument("--index-collections", default="npl,nfcorpus")
    ap.add_argument("--collection", default=QUERY_COLLECTION,
                    help="collection of parts (a) and (b) (default npl)")
    ap.add_argument("--fresh", action="store_true", help="rebuild the cached engine collection")
    args = ap.parse_args()
    parts = set(common.parse_list(args.parts))
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    console.print(f"data: {common.DATA}; load average at start: "
                  f"{tuple(round(x, 2) for x in common.machine()['loadavg'])}")
    result: dict = {"passes": args.passes, "min_time_s": args.min_time,
                    "index_passes": args.index_passes, "torch_threads": torch.get_num_threads(),
                    "targets": TARGETS}
    rows = []

    if parts & {"a", "b"}:
        folder = common.collection_folder(args.collection)
        if folder is None:
            result["skipped"] = [args.collection]
        else:
            ids, titles, texts = common.read_corpus(folder)
            doc_texts = [common.doc_text(ti, te) for ti, te in zip(titles, texts)]
            queries = common.read_queries(folder)
            result["query_collection"] = args.collection
            result["engine_collection"] = common.ensure_collection(args.collection, folder,
                                                                   len(ids), fresh=args.fresh)
            from polyindex.engine import Engine
            coll = Engine(ENGINE_DATA).collection(args.collection)
            if "a" in parts:
                console.print("[dim](a) lexical, one query at a time ...[/dim]")
                a = result["lexical"] = part_lexical(coll, ids, doc_texts, queries, args.passes,
                                                     args.min_time)
                q = a["qps"]
                rows += [
                    ["(a) lexical 1-by-1", "engine", f"{q['engine']['median']:,.0f} q/s",
                     "bm25s tokenize+retrieve", f"{q['bm25s']['median']:,.0f} q/s",
                     f"{a['ratio']['vs_bm25s']:.2f}", "≥ 1.00",
                     verdict(a["ratio"]["vs_bm25s"] >= TARGETS["lexical"])],
                    ["", "engine", "", "bm25s pre-tokenized",
                     f"{q['bm25s_pretokenized']['median']:,.0f} q/s",
                     f"{a['ratio']['vs_bm25s_pretokenized']:.2f}", "info", "-"],
                    ["", "engine", "", "bm25s numba backend", f"{q['bm25s_numba']['median']:,.0f} q/s",
                     f"{a['ratio']['vs_bm25s_numba']:.2f}", "info", "-"]]
            if "b" in parts:
                console.print("[dim](b) dense with precomputed query vectors ...[/dim]")
                b = result["dense"] = part_dense(coll, queries, args.passes, args.min_time)
                for mode, key, label in (("one_at_a_time", "one_at_a_time_qps", "1-by-1"),
                                         ("batched", "batched_qps", f"batch of {b['queries']}")):
                    q = b[key]
                    rows.append([f"(b) dense {label}", "engine", f"{q['engine']['median']:,.0f} q/s",
                                 "raw FAISS IndexFlatIP", f"{q['faiss']['median']:,.0f} q/s",
                                 f"{b['ratio'][mode]:.2f}", "≥ 0.90",
                                 verdict(b["ratio"][mode] >= TARGETS["dense"])])
    if "c" in parts:
        c = result["indexing"] = part_index(common.parse_list(args.index_collections),
                                            args.index_passes)
        for r in c:
            d = r["docs_per_s"]
            rows.append([f"(c) bulk index {r['collection']} ({r['documents']:,} docs)", "engine",
                         f"{d['engine']['median']:,.0f} docs/s", "raw ST encode bf16",
                         f"{d['raw_encode']['median']:,.0f} docs/s", f"{r['ratio']:.2f}",
                         "≥ 0.85", verdict(r["ratio"] >= TARGETS["index"])])

    console.print(table(f"speed ratios (engine / reference), median of passes; torch threads "
                        f"{torch.get_num_threads()}; load average at end "
                        f"{tuple(round(x, 2) for x in common.machine()['loadavg'])}",
                        ["measurement", "engine", "rate", "reference", "rate", "ratio", "target",
                         "result"], rows))
    if "lexical" in result:
        console.print(f"lexical top-10 overlap engine vs bm25s: "
                      f"{result['lexical']['top10_overlap_with_bm25s']:.3f}")
    if "dense" in result:
        console.print(f"dense: identical top-10 ids engine vs faiss: "
                      f"{result['dense']['identical_top10_queries']}; faiss OpenMP threads (both "
                      f"sides, one process): {result['dense']['faiss_omp_threads']}")
    checks = []
    if "lexical" in result:
        checks.append(result["lexical"]["ratio"]["vs_bm25s"] >= TARGETS["lexical"])
    if "dense" in result:
        checks += [v >= TARGETS["dense"] for v in result["dense"]["ratio"].values()]
    checks += [r["ratio"] >= TARGETS["index"] for r in result.get("indexing", [])]
    result["all_pass"] = all(checks) if checks else None
    common.save_results("bench_speed", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
