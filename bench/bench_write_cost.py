"""Writes cost the batch, not the corpus: acknowledged-upsert latency of a 100-document batch
into a collection of 1,000 documents and into one of ``--big`` (default 1,000,000).

Both are lexical collections of generated text (``model=None``: nothing to encode), bulk-
built in ``segment_size`` chunks, then opened in online mode (WAL fsync per batch, buffer,
background seals; background merging off so both do the same work) and written in
alternating batches, half new ids and half rewrites of stored ones (which must hide rows
in the sealed segments). Reported: p50 and p90 of the acknowledged ``add()`` per collection
and the ratio big / small (goal <= 1.5). Writes bench/results/bench_write_cost.json.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import WORK, console, save_results, table  # noqa: E402


def texts(rng, vocab, p, n: int) -> list[str]:
    words = rng.choice(len(vocab), size=(n, 30), p=p)
    return [" ".join(vocab[w]) for w in words]


def build(path: Path, n: int, rng, vocab, p) -> None:
    import polyindex
    shutil.rmtree(path, ignore_errors=True)
    with polyindex.open(path) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        chunk = coll.config.segment_size
        t0 = time.perf_counter()
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            coll.add([{"id": f"d{s + i}", "text": t} for i, t in enumerate(texts(rng, vocab, p, m))])
            el = time.perf_counter() - t0
            console.print(f"  {path.name}: {s + m:,}/{n:,} docs, {(s + m) / el:,.0f} docs/s",
                          highlight=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--work", type=Path, default=WORK / "write_cost")
    ap.add_argument("--reuse", action="store_true", help="keep collections built by a former run")
    args = ap.parse_args()
    os.environ["POLYINDEX_MERGE"] = "0"
    from polyindex.config import reload_settings
    reload_settings()  # settings are read once: again, with the line above
    import polyindex
    rng = np.random.default_rng(0)
    vocab = np.array([f"w{i}" for i in range(20_000)])
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.07
    p /= p.sum()
    sizes = {"small": args.small, "big": args.big}
    for name, n in sizes.items():
        path = args.work / name
        if not (args.reuse and (path / "c" / "manifest.json").exists()):
            build(path, n, rng, vocab, p)
    engines = {name: polyindex.open(args.work / name, online=True) for name in sizes}
    colls = {name: e.collection("c") for name, e in engines.items()}
    lat: dict[str, list[float]] = {name: [] for name in sizes}
    for b in range(args.batches):
        for name in (list(sizes) if b % 2 == 0 else list(sizes)[::-1]):
            n = sizes[name]
            half = args.batch // 2
            old = rng.integers(n, size=half)  # rewrites: rows hidden in sealed segments
            ids = [f"d{i}" for i in old] + [f"n{b}_{i}" for i in range(args.batch - half)]
            docs = [{"id": i, "text": t} for i, t in zip(ids, texts(rng, vocab, p, len(ids)))]
            t0 = time.perf_counter()
            colls[name].add(docs)
            lat[name].append((time.perf_counter() - t0) * 1e3)
    for e in engines.values():
        e.close()
    res = {name: {"docs": sizes[name], "p50_ms": statistics.median(v),
                  "p90_ms": float(np.percentile(v, 90))} for name, v in lat.items()}
    ratio = res["big"]["p50_ms"] / res["small"]["p50_ms"]
    console.print(table(f"acknowledged {args.batch}-doc upserts ({args.batches} each, alternating)",
                        ["collection", "docs", "p50 ms", "p90 ms"],
                        [[k, f"{v['docs']:,}", f"{v['p50_ms']:.2f}", f"{v['p90_ms']:.2f}"]
                         for k, v in res.items()]))
    console.print(f"p50 ratio big / small: {ratio:.2f} (goal <= 1.5)", highlight=False)
    save_results("bench_write_cost", {"args": {k: str(v) for k, v in vars(args).items()},
                                      "collections": res, "ratio_p50": ratio})


if __name__ == "__main__":
    main()
