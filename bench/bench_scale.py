"""Scale: peak RSS and query latency of a lexical + dense collection at growing sizes.

Generated text (30 words from a Zipf vocabulary) and generated vectors (``--dim``, a
mixture around 200 centres), a vectors-only collection (nothing to encode) with
``lexical`` and ``dense:<--dense>`` (default ``IVF1024,PQ48``: codes in the index, each
vector stored once as a memory-mapped column). Each size is built once (``add()`` in
``segment_size`` chunks, then ``compact()``), then measured in a fresh process: RSS after
opening, peak RSS during a query load (``--queries`` lexical, dense and hybrid queries),
p50 and p99 latency per profile, and lexical top-10 latency with block-max MaxScore and
term-at-a-time (alternating, same process). The ratio of RSS at the largest size to RSS at
the smallest, and the growth fitted over sizes (RSS = a + b x docs), are printed; the
issue's goal is RSS at 10M at most 4x RSS at 1M. Writes bench/results/bench_scale.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import WORK, console, save_results, synthetic_vectors, table  # noqa: E402

# What both measuring scripts share: /proc/self/status in MB, and one timed query of each
# profile (a 3-word text from the generated vocabulary, a random unit vector) into ``lat``.
COMMON = r"""
def status_mb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
vocab = [f"w{i}" for i in range(2000)]
def query_round(coll, rng, dim, lat):
    text = " ".join(rng.choice(vocab, 3))
    vec = rng.standard_normal(dim).astype(np.float32)
    vec /= np.linalg.norm(vec)
    for p in lat:
        t0 = time.perf_counter()
        if p == "lexical":
            coll.query(text, k=10, profile=p)
        elif p == "dense":
            coll.query(vector=vec, k=10, profile=p)
        else:
            coll.query(text, vector=vec, k=10, profile=p)
        lat[p].append((time.perf_counter() - t0) * 1e3)
"""

MEASURE = r'''
import json, statistics, sys, time
import numpy as np
import polyindex
path, n_q, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
''' + COMMON + r'''
def rss_mb():
    return status_mb("VmRSS")
base = rss_mb()
coll = polyindex.open(path, readonly=True).collection("c")
coll.count()
opened = rss_mb()
rng = np.random.default_rng(3)
lat = {"lexical": [], "dense": [], "hybrid": []}
for i in range(n_q):
    query_round(coll, rng, dim, lat)
# VmHWM, not ru_maxrss: after fork + exec Linux reports the parent's high-water mark there
peak = status_mb("VmHWM")
def rss_by_file():
    """Resident MB of the collection's mapped files, by file name (summed over segments)."""
    out, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not line.startswith(("Rss", "Pss")):
                name = head[5] if len(head) > 5 and path in head[5] else None
            elif head[0] == "Rss:" and name is not None:
                key = name.rsplit("/", 1)[-1]
                out[key] = out.get(key, 0) + int(head[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
anon = status_mb("RssAnon")  # private memory; the rest of RSS is mapped file pages
# block-max MaxScore against term-at-a-time, same queries, alternating (ABAB), after the load
from polyindex.index.lexical import kind as lexical_kind
texts = [" ".join(rng.choice(vocab, 3)) for _ in range(n_q)]
prune = {"on": [], "off": []}
for r in range(4):
    side = "on" if r % 2 == 0 else "off"
    lexical_kind.BLOCKMAX = side == "on"
    for text in texts:
        t0 = time.perf_counter()
        coll.query(text, k=10, profile="lexical")
        prune[side].append((time.perf_counter() - t0) * 1e3)
lexical_kind.BLOCKMAX = True
print(json.dumps({"rss_start_mb": base, "rss_open_mb": opened, "rss_peak_mb": peak,
                  "rss_anon_end_mb": anon, "rss_files_end_mb": rss_by_file(),
                  "p50_ms": {p: statistics.median(v[5:]) for p, v in lat.items()},
                  "p99_ms": {p: float(np.percentile(v[5:], 99)) for p, v in lat.items()},
                  "lexical_pruning_ms": {side: {"p50": statistics.median(v),
                                                "p99": float(np.percentile(v, 99))}
                                         for side, v in prune.items()},
                  "segments": len(coll.view().segments), "docs": coll.count()}))
'''


# Queries while a bounded writer streams: the collection opened online (WAL, buffer, seals in
# the background, as `polyindex serve` writes), a thread upserting batches of generated
# documents (ids x0.., the same every run) until it has written `--writer-docs` or run
# `--writer-seconds`; the main thread queries meanwhile (latencies kept while the writer
# runs). The written documents are deleted afterwards, so a later run measures the same
# collection.
MEASURE_WRITER = r"""
import json, statistics, sys, threading, time
import numpy as np
from polyindex.engine import Engine
path, n_q, dim, n_docs, seconds, batch = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                          int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
""" + COMMON + r"""
eng = Engine(path, online=True)
coll = eng.collection("c")
rng = np.random.default_rng(7)
wrote, stop, failed, wlat = [0], threading.Event(), [], []
def writer():
    try:
        r = np.random.default_rng(11)
        t_end = time.monotonic() + seconds
        while wrote[0] < n_docs and time.monotonic() < t_end and not stop.is_set():
            m = min(batch, n_docs - wrote[0])
            v = r.standard_normal((m, dim)).astype(np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            docs = [{"id": f"x{wrote[0] + i}", "text": " ".join(r.choice(vocab, 30)),
                     "vector": v[i]} for i in range(m)]
            t0 = time.perf_counter()
            coll.add(docs)
            wlat.append((time.perf_counter() - t0) * 1e3)
            wrote[0] += m
    except BaseException as e:
        failed.append(repr(e))
lat = {"lexical": [], "dense": [], "hybrid": []}
t = threading.Thread(target=writer)
t0w = time.monotonic()
t.start()
i = 0
while t.is_alive() and i < n_q * 50:
    query_round(coll, rng, dim, lat)
    i += 1
stop.set()
t.join()
elapsed = time.monotonic() - t0w
peak = status_mb("VmHWM")
coll.delete([f"x{j}" for j in range(wrote[0])])
eng.close()
print(json.dumps({"writer_docs": wrote[0], "writer_seconds": elapsed, "writer_failed": failed,
                  "writer_batch_ms_p50": statistics.median(wlat) if wlat else None,
                  "queries_under_writer": len(lat["lexical"]), "rss_peak_mb": peak,
                  "p50_ms": {p: statistics.median(v[5:]) for p, v in lat.items() if len(v) > 5},
                  "p99_ms": {p: float(np.percentile(v[5:], 99)) for p, v in lat.items()
                             if len(v) > 5}}))
"""


def build(path: Path, n: int, dim: int, dense: str, resume: bool = False,
          compact: bool = True) -> float:
    """Build ``n`` generated documents at ``path``, one ``add()`` (one committed segment) per
    ``segment_size`` chunk. Each chunk's text and vectors come from a generator seeded by its
    start, so ``resume`` continues a build that died from the documents it committed (every
    ``add`` is all or nothing, so the count is a whole number of chunks) with the same
    documents a build in one go writes. Returns the seconds this call spent building."""
    import polyindex
    if not resume:
        shutil.rmtree(path, ignore_errors=True)
    vocab = np.array([f"w{i}" for i in range(20_000)])
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.07
    p /= p.sum()
    centres = np.random.default_rng(0).standard_normal((200, dim)).astype(np.float32)
    t0 = time.perf_counter()
    with polyindex.open(path) as eng:
        if "c" in eng.list_collections():
            coll = eng.collection("c")
        else:
            coll = eng.create_collection("c", ["lexical", f"dense:{dense}"], model=None)
        chunk = coll.config.segment_size
        start = coll.count()
        if start % chunk:
            raise SystemExit(f"{path}: {start:,} documents is not a whole number of "
                             f"{chunk:,}-document chunks; rebuild without --resume")
        if start:
            console.print(f"  {n:,}: resuming at {start:,} documents", highlight=False)
        for s in range(start, n, chunk):
            m = min(chunk, n - s)
            rng = np.random.default_rng([1, s])
            words = rng.choice(len(vocab), size=(m, 30), p=p)
            vecs = synthetic_vectors(centres, m, 0.35, s)
            coll.add([{"id": f"d{s + i}", "text": " ".join(vocab[w]), "vector": v}
                      for i, (w, v) in enumerate(zip(words, vecs))])
            el = time.perf_counter() - t0
            rate = (s + m - start) / el
            console.print(f"  {n:,}: {s + m:,} docs, {rate:,.0f} docs/s, ETA "
                          f"{(n - s - m) / max(rate, 1e-9) / 60:,.1f} min, peak RSS "
                          f"{_peak_mb():,.0f} MB", highlight=False)
            sys.stdout.flush()  # progress shows in a redirected log too
        if compact:
            console.print(f"  {n:,}: compacting", highlight=False)
            coll.compact()
    return time.perf_counter() - t0


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--dense", default="IVF1024,PQ48")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--work", type=Path, default=WORK / "scale")
    ap.add_argument("--reuse", action="store_true",
                    help="measure an existing collection (built in full) instead of rebuilding")
    ap.add_argument("--resume", action="store_true",
                    help="continue a build that stopped, from the documents it committed")
    ap.add_argument("--build-only", action="store_true", help="build, do not measure")
    ap.add_argument("--no-compact", action="store_true",
                    help="leave the segments the merge policy made (no final compact: at 10M a "
                         "whole-collection merge needs more memory than this machine has)")
    ap.add_argument("--writer-docs", type=int, default=20_000,
                    help="documents the bounded writer streams during the second query load "
                         "(0: no writer phase)")
    ap.add_argument("--writer-seconds", type=float, default=120.0)
    ap.add_argument("--writer-batch", type=int, default=500)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    out = {}
    for n in sizes:
        path = args.work / f"n{n}"
        built = None
        if not (args.reuse and (path / "c" / "manifest.json").exists()):
            built = build(path, n, args.dim, args.dense, args.resume, not args.no_compact)
            (args.work / f"n{n}.build.json").write_text(json.dumps(
                {"build_seconds": built, "build_peak_rss_mb": _peak_mb(), "resumed": args.resume}))
        if args.build_only:
            continue
        run = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(args.queries),
                              str(args.dim)], capture_output=True, text=True, check=True)
        res = json.loads(run.stdout.strip().splitlines()[-1])
        # before the writer phase (its WAL and tombstones)
        res["disk_mb"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
        if args.writer_docs:
            run = subprocess.run([sys.executable, "-c", MEASURE_WRITER, str(path),
                                  str(args.queries), str(args.dim), str(args.writer_docs),
                                  str(args.writer_seconds), str(args.writer_batch)],
                                 capture_output=True, text=True, check=True)
            res["under_writer"] = json.loads(run.stdout.strip().splitlines()[-1])
        stamp = args.work / f"n{n}.build.json"
        if built is None and stamp.exists():  # built by an earlier (--build-only) run
            res.update(json.loads(stamp.read_text()))
        res.setdefault("build_seconds", built)
        out[n] = res
    if args.build_only:
        return
    rows = [[f"{n:,}", r["segments"], f"{r['rss_open_mb']:,.0f}", f"{r['rss_peak_mb']:,.0f}",
             f"{r['rss_anon_end_mb']:,.0f}",
             f"{r['disk_mb']:,.0f}", *(f"{r['p50_ms'][p]:.2f}" for p in ("lexical", "dense", "hybrid")),
             f"{r['p99_ms']['lexical']:.2f}"]
            for n, r in out.items()]
    for n, r in out.items():
        w = r.get("under_writer")
        if w:
            console.print(f"{n:,} under a writer ({w['writer_docs']:,} documents in "
                          f"{w['writer_seconds']:.0f} s, batches of {args.writer_batch}): p50 / p99 "
                          + ", ".join(f"{p} {w['p50_ms'][p]:.2f} / {w['p99_ms'][p]:.2f} ms"
                                      for p in w["p50_ms"]) + f"; peak RSS {w['rss_peak_mb']:,.0f} MB",
                          highlight=False)
        on, off = r["lexical_pruning_ms"]["on"], r["lexical_pruning_ms"]["off"]
        console.print(f"{n:,}: lexical k=10 with block-max MaxScore p50 {on['p50']:.2f} / p99 "
                      f"{on['p99']:.2f} ms, term-at-a-time p50 {off['p50']:.2f} / p99 "
                      f"{off['p99']:.2f} ms", highlight=False)
    console.print(table(f"scale (lexical + dense:{args.dense}, {args.dim}-d)",
                        ["docs", "segments", "RSS open MB", "RSS peak MB", "private MB", "disk MB",
                         "lexical p50 ms", "dense p50 ms", "hybrid p50 ms", "lexical p99 ms"],
                        rows))
    if 1_000_000 in out and 10_000_000 in out:
        ratio = out[10_000_000]["rss_peak_mb"] / out[1_000_000]["rss_peak_mb"]
        console.print(f"measured peak RSS at 10M / at 1M: {ratio:.2f}x (goal <= 4)",
                      highlight=False)
    fit = None
    if len(sizes) >= 2:
        b, a = np.polyfit(sizes, [out[n]["rss_peak_mb"] for n in sizes], 1)
        fit = {"mb_fixed": a, "mb_per_million_docs": b * 1e6,
               "predicted_10M_mb": a + b * 1e7,
               "predicted_ratio_10M_over_1M": (a + b * 1e7) / (a + b * 1e6)}
        pb, pa_ = np.polyfit(sizes, [out[n]["rss_anon_end_mb"] for n in sizes], 1)
        fit["private_mb_per_million_docs"] = pb * 1e6
        fit["private_predicted_ratio_10M_over_1M"] = (pa_ + pb * 1e7) / (pa_ + pb * 1e6)
        console.print(f"private memory: {pa_:,.0f} MB + {pb * 1e6:,.0f} MB per million docs; "
                      f"10M predicted {fit['private_predicted_ratio_10M_over_1M']:.2f}x the 1M "
                      "figure", highlight=False)
        console.print(f"fitted peak RSS: {a:,.0f} MB + {b * 1e6:,.0f} MB per million docs; "
                      f"10M predicted {fit['predicted_10M_mb']:,.0f} MB, "
                      f"{fit['predicted_ratio_10M_over_1M']:.2f}x the 1M figure (goal <= 4)",
                      highlight=False)
    save_results("bench_scale", {"args": {k: str(v) for k, v in vars(args).items()},
                                 "sizes": out, "fit": fit})


if __name__ == "__main__":
    main()
