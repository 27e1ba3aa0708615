"""Query cost and memory of an opened collection, this checkout against a baseline checkout.

What it measures (issue 17 parts 4-5): a 200,000-document lexical + dense collection
(``model=None``: generated text, Zipfian over a 20,000-word synthetic vocabulary, 20-40
words a document, seed 1234; random float32 vectors of ``--dim`` 128 in the unnamed user
field, the default ``dense`` index: ``HNSW32,Flat`` per 50,000-row segment; an int field
``year`` rising with the document number, so segments hold disjoint year ranges, as
time-ordered data does; 2% of the documents deleted, so every segment has tombstones) is built
once with this checkout into ``bench/.work/query_cost/``. Then, alternating (ABAB...,
``--rounds`` times), a fresh process of each implementation (this checkout and the baseline,
by its Python: ``--baseline-python``, e.g. a worktree of the commit before the change with
its own editable install) opens it and reports:

- RSS (``VmRSS``) and anonymous RSS (``RssAnon``: private memory, not file pages that the
  kernel can drop) after imports, after opening the collection (every segment opened), and
  after the query load;
- per-query latency (one query a call, k=10, after 30 warm-up queries) for ``lexical``,
  ``dense``, ``hybrid`` (text + vector, RRF) without filter, and with a filter that repeats
  across queries: ``lexical`` with ``year >= 2010`` (the last segment; the others cannot
  match), ``dense`` with ``1990 <= year < 2000`` (~14% of the documents, all in the third
  segment), ``dense`` with ``lang == "de"`` (a string field: evaluated, then cached).

Reported: medians over rounds of each process's p50 and mean, and ratios this / baseline
(side by side in one run), and for latencies the median over rounds of the ratio within each
adjacent pair of processes (robust to the load drifting between rounds). This checkout's
processes also time the raw faiss search of every segment with its index memory-mapped (as
opened) and read into memory, in the same process, alternating blocks of 30 queries (``faiss
search, index mmap|ram``), and lexical queries with the vocabulary found by binary search
over Arrow and through the per-segment dict of before (restored by patching), likewise
alternating, each query with the document-frequency cache emptied (``lexical, no df cache,
vocab arrow|dict``). Usage: ``python bench/bench_query_cost.py --baseline-python
../wt-query-base/.venv/bin/python [--n 200000] [--dim 128] [--rounds 3] [--queries 300]
[--fresh]``. Writes ``bench/results/bench_query_cost.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "query_cost"
SEED = 1234
VOCAB = 20_000
CLASSES = ["lexical", "dense", "hybrid", "lexical+year>=2010", "dense+year[1990,2000)",
           "dense+lang=de"]


def _rss() -> dict:
    out = {}
    for line in open("/proc/self/status"):
        key = line.split(":")[0]
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) * 1024
    return out


def _words(rng):
    import numpy as np
    cons, vows = list("bcdfghklmnprstvz"), list("aeiou")
    syl = [c + v for c in cons for v in vows]  # 80 syllables
    words = set()
    while len(words) < VOCAB:
        words.add("".join(rng.choice(syl, size=int(rng.integers(2, 4)))))
    return np.array(sorted(words), dtype=object)


def build(folder: Path, n: int, dim: int) -> None:
    import numpy as np

    import polyindex
    rng = np.random.default_rng(SEED)
    vocab = _words(rng)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.07
    p /= p.sum()
    eng = polyindex.open(folder)
    coll = eng.create_collection("qc", ["lexical", "dense"], model=None,
                                 fields={"year": "int", "lang": "string"})
    batch = 50_000
    for start in range(0, n, batch):
        m = min(batch, n - start)
        lens = rng.integers(20, 41, m)
        toks = vocab[rng.choice(VOCAB, size=int(lens.sum()), p=p)]
        vecs = rng.standard_normal((m, dim)).astype(np.float32)
        docs, at = [], 0
        for j in range(m):
            i = start + j
            docs.append({"id": f"d{i}", "text": " ".join(toks[at:at + lens[j]]),
                         "vector": vecs[j], "year": 1950 + (70 * i) // n,
                         "lang": ("en", "de", "fr", "es")[i % 4]})
            at += lens[j]
        t0 = time.perf_counter()
        coll.add(docs)
        print(f"  built rows {start}..{start + m} in {time.perf_counter() - t0:.0f} s", flush=True)
    dead = rng.choice(n, size=n // 50, replace=False)
    coll.delete([f"d{i}" for i in dead.tolist()])
    eng.close()


def worker(folder: Path, queries: int, dim: int) -> dict:
    import numpy as np
    import polyindex
    before = _rss()
    t0 = time.perf_counter()
    eng = polyindex.open(folder, readonly=True)
    coll = eng.collection("qc")
    snap = coll.view()
    open_s = time.perf_counter() - t0
    opened = _rss()
    rng = np.random.default_rng(99)
    vocab = _words(np.random.default_rng(SEED))
    texts = [" ".join(rng.choice(vocab[:5000], size=3)) for _ in range(queries + 30)]
    vecs = rng.standard_normal((queries + 30, dim)).astype(np.float32)
    hybrid = {"retrieve": [{"index": "lexical", "k": 100}, {"index": "dense", "k": 100}],
              "fuse": {"method": "rrf"}}
    calls = {
        "lexical": lambda i: coll.query(texts[i], k=10, profile="lexical"),
        "dense": lambda i: coll.query(vector=vecs[i], k=10, profile="dense"),
        "hybrid": lambda i: coll.query_batch([texts[i]], vectors=[vecs[i]], k=10,
                                             profile=hybrid),
        "lexical+year>=2010": lambda i: coll.query(texts[i], k=10, profile="lexical",
                                                   filter={"year": {"gte": 2010}}),
        "dense+year[1990,2000)": lambda i: coll.query(vector=vecs[i], k=10, profile="dense",
                                                      filter={"year": {"gte": 1990, "lt": 2000}}),
        "dense+lang=de": lambda i: coll.query(vector=vecs[i], k=10, profile="dense",
                                              filter={"lang": "de"}),
    }
    lat = {}
    for name in CLASSES:
        f = calls[name]
        for i in range(30):
            f(i)
        ts = []
        for i in range(30, 30 + queries):
            t = time.perf_counter()
            f(i)
            ts.append(time.perf_counter() - t)
        lat[name] = {"p50_ms": 1e3 * statistics.median(ts), "mean_ms": 1e3 * statistics.fmean(ts)}
    after = _rss()
    mmap_ab = _mmap_ab(snap, vecs) if hasattr(__import__("polyindex.index.dense.kind").index.dense.kind,
                                              "read_index") else None
    vocab_ab = _vocab_ab(coll, texts)
    out = {"mmap_vs_ram": mmap_ab, "vocab_arrow_vs_dict": vocab_ab,
           "segments": len(snap.segments), "documents": snap.count(), "open_s": open_s,
           "rss_import": before, "rss_open": opened, "rss_queries": after, "latency": lat}
    eng.close()
    return out


def _mmap_ab(snap, vecs) -> dict:
    """In one process, the same faiss search over each segment's index read memory-mapped
    (as opened) and read into memory, alternating blocks of queries: p50 per query (ms)."""
    import faiss
    pairs = []
    for seg in snap.segments:
        d = seg.indexes["dense"]
        pairs.append((d.index, faiss.read_index(str(d.folder / "dense.faiss"))))
    times = {"mmap": [], "ram": []}
    for block in range(10):
        for name, which in (("mmap", 0), ("ram", 1)) if block % 2 == 0 else (("ram", 1),
                                                                            ("mmap", 0)):
            for i in range(block * 30, block * 30 + 30):
                q = vecs[i % len(vecs)].reshape(1, -1)
                t = time.perf_counter()
                for p in pairs:
                    p[which].search(q, 10)
                times[name].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def _vocab_ab(coll, texts) -> dict | None:
    """In one process, lexical queries with the vocabulary looked up by binary search over
    its Arrow column (as built) and through a dict per segment (the code before, restored
    by patching), alternating blocks of 30 queries; the snapshot's df cache is emptied before
    each query so both pay the document-frequency lookups of every term: p50 per query (ms)."""
    import numpy as np
    from polyindex.index import postings
    from polyindex.index.lexical import kind as lexical
    if not hasattr(lexical.LexicalSegment, "term_array"):
        return None
    seg_cls, kind_cls = lexical.LexicalSegment, lexical.LexicalKind
    new = (seg_cls._query_terms, kind_cls._doc_freqs)
    for seg in coll.view().segments:
        lex = seg.indexes["lexical"]
        lex.term_index = dict(zip(lex.terms(), range(lex.n_terms)))

    def old_query_terms(self, prepared, scale=1.0):
        get = self.term_index.get
        qptr, ids, ws = [0], [], []
        for terms, weights in zip(prepared.terms, prepared.weights):
            for term, w in zip(terms, weights):
                tid = get(term)
                if tid is not None:
                    ids.append(tid)
                    ws.append(w * scale)
            qptr.append(len(ids))
        return np.array(qptr, np.int64), np.array(ids, np.int64), np.array(ws, np.float64)

    def old_doc_freqs(self, terms, segments, live):
        df = [0] * len(terms)
        for seg, mask in zip(segments, live):
            get = seg.term_index.get
            found = [(i, tid) for i, tid in enumerate(map(get, terms)) if tid is not None]
            if not found:
                continue
            if mask is None:
                for i, tid in found:
                    df[i] += int(seg.df[tid])
            else:
                tids = np.array([tid for _, tid in found], np.int64)
                for (i, _), c in zip(found, postings.count_live(seg.offsets, seg.P, tids,
                                                                 mask).tolist()):
                    df[i] += c
        return df
    variants = {"arrow": new, "dict": (old_query_terms, old_doc_freqs)}
    times = {"arrow": [], "dict": []}
    try:
        for block in range(10):
            names = ("arrow", "dict") if block % 2 == 0 else ("dict", "arrow")
            for name in names:
                seg_cls._query_terms, kind_cls._doc_freqs = variants[name]
                for i in range(block * 30, block * 30 + 30):
                    coll.view().cache["lexical"].pop("lexical:df", None)
                    t = time.perf_counter()
                    coll.query(texts[i % len(texts)], k=10, profile="lexical")
                    times[name].append(time.perf_counter() - t)
    finally:
        seg_cls._query_terms, kind_cls._doc_freqs = new
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--baseline-python", default=None)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--worker", default=None)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(Path(args.worker), args.queries, args.dim)))
        return
    sys.path.insert(0, str(HERE))
    import common
    folder = WORK / f"n{args.n}_d{args.dim}"
    if args.fresh or not (folder / "qc").exists():
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
        print(f"building {args.n} documents into {folder}", flush=True)
        build(folder, args.n, args.dim)
    impls = {"this": sys.executable}
    if args.baseline_python:
        impls["baseline"] = args.baseline_python
    runs: dict[str, list[dict]] = {k: [] for k in impls}
    for r in range(args.rounds):
        order = list(impls) if r % 2 == 0 else list(reversed(impls))
        for name in order:
            cmd = [impls[name], __file__, "--worker", str(folder), "--queries",
                   str(args.queries), "--dim", str(args.dim)]
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
            if proc.returncode:
                raise SystemExit(f"{name} worker failed:\n{proc.stderr[-3000:]}")
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: done", flush=True)

    def med(name, f):
        return statistics.median(f(x) for x in runs[name])
    summary = {}
    for name in impls:
        s = {"open_rss_mb": med(name, lambda x: (x["rss_open"]["VmRSS"]
                                                  - x["rss_import"]["VmRSS"]) / 2**20),
             "open_anon_mb": med(name, lambda x: (x["rss_open"]["RssAnon"]
                                                   - x["rss_import"]["RssAnon"]) / 2**20),
             "queries_rss_mb": med(name, lambda x: (x["rss_queries"]["VmRSS"]
                                                     - x["rss_import"]["VmRSS"]) / 2**20),
             "queries_anon_mb": med(name, lambda x: (x["rss_queries"]["RssAnon"]
                                                      - x["rss_import"]["RssAnon"]) / 2**20),
             "open_s": med(name, lambda x: x["open_s"])}
        for c in CLASSES:
            s[f"{c} p50_ms"] = med(name, lambda x: x["latency"][c]["p50_ms"])
            s[f"{c} mean_ms"] = med(name, lambda x: x["latency"][c]["mean_ms"])
        if runs[name][0].get("vocab_arrow_vs_dict"):
            for k in ("arrow", "dict"):
                s[f"lexical, no df cache, vocab {k} p50_ms"] = med(
                    name, lambda x: x["vocab_arrow_vs_dict"][k])
        if runs[name][0].get("mmap_vs_ram"):
            for k in ("mmap", "ram"):
                s[f"faiss search, index {k} p50_ms"] = med(name, lambda x: x["mmap_vs_ram"][k])
        summary[name] = s
    paired = {}
    if "baseline" in impls:  # rounds run as adjacent pairs: the median of per-pair ratios
        for c in CLASSES:  # is robust to the machine's load drifting between rounds
            for stat in ("p50_ms", "mean_ms"):
                paired[f"{c} {stat}"] = statistics.median(
                    a["latency"][c][stat] / b["latency"][c][stat]
                    for a, b in zip(runs["this"], runs["baseline"]))
    rows = []
    for key in summary["this"]:
        row = [key] + [f"{summary[n][key]:.3f}" if key in summary[n] else "-" for n in impls]
        if "baseline" in impls and summary["baseline"].get(key):
            row.append(f"{summary['this'][key] / summary['baseline'][key]:.3f}")
            row.append(f"{paired[key]:.3f}" if key in paired else "")
        rows.append(row)
    cols = ["measure", *impls] + (["this / baseline", "median of paired ratios"]
                                  if "baseline" in impls else [])
    common.console.print(common.table(
        f"opened {runs['this'][0]['documents']} docs in {runs['this'][0]['segments']} segments "
        f"(medians of {args.rounds} alternating processes each)", cols, rows))
    common.save_results("bench_query_cost", {
        "n": args.n, "dim": args.dim, "rounds": args.rounds, "queries": args.queries,
        "baseline_python": args.baseline_python, "summary": summary,
        "paired_ratios": paired, "runs": runs})


if __name__ == "__main__":
    main()
