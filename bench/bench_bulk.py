"""Bulk path of a lexical + IVF-PQ collection (issue 43): the old path against the new one.

``--build``: bench_scale's generated documents (30 Zipf words, 384-d user vectors,
``lexical`` + ``dense:IVF1024,PQ48``, ``--model none``) built at ``--docs`` with ``add()``
in 50,000-document chunks and ``compact()``, once the old way (IVF,PQ template trained with
faiss's polysemous step, merges re-encoding every vector, texts analyzed one by one:
``index.dense.kind.POLYSEMOUS`` / ``MERGE_CODES``, ``index.lexical.kind.ANALYZE_COLUMNS``)
and once the new way, alternating for ``--rounds``, in this one process
(merges in this process too: ``POLYINDEX_BUILD_WORKER=0``, so the CPU time counts them).
Per build: wall seconds, CPU seconds (every thread of the process), documents/s, and the
time by phase (wall and CPU of the functions that do the work, timed by wrappers).

``--merge-rss COLLECTION_DIR``: the peak RSS of merging one segment. The collection is
copied under ``--work``, ``--delete`` of the segment's rows are deleted (so the merge
rewrites it), and ``merge`` runs in a fresh process per path (old, new), reporting RSS after
opening, VmHWM after the merge and the peak of its private memory (RssAnon sampled every
20 ms: VmHWM also counts the source files' mapped pages, which the kernel can drop).
Writes bench/results/bench_bulk.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("POLYINDEX_BUILD_WORKER", "0")
sys.path.insert(0, str(Path(__file__).parent))
from common import WORK, console, save_results, table  # noqa: E402


def _phases():
    """Wrap the functions the build spends its time in; returns the {phase: [wall, cpu]}
    totals they add to (nested phases are each counted: ``merge`` contains its kinds')."""
    from polyindex.index.dense import kind as dense_kind
    from polyindex.index.lexical import kind as lexical_kind
    from polyindex.ingest import documents
    from polyindex.storage import merge, writer
    totals: dict[str, list[float]] = {}

    def wrap(owner, attr, phase):
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*a, **k):
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                t = totals.setdefault(phase, [0.0, 0.0])
                t[0] += time.perf_counter() - w0
                t[1] += time.process_time() - c0
        setattr(owner, attr, timed)
        return fn

    wrap(documents, "from_user", "per-document checks (add: from_user)")
    wrap(dense_kind.DenseKind, "train", "dense: train IVF,PQ template (once)")
    wrap(dense_kind.DenseKind, "build", "dense: IVF-PQ encode (build; old merges too)")
    wrap(dense_kind.DenseKind, "merge", "dense: merge")
    wrap(lexical_kind.LexicalKind, "build", "lexical: analyze + postings (build)")
    wrap(lexical_kind.LexicalKind, "merge", "lexical: merge (forward index)")
    wrap(writer, "write_docs", "docs.arrow + id index write (add)")
    wrap(writer, "fsync_tree", "fsync segment files (add)")
    wrap(merge, "fsync_tree", "fsync segment files (merge)")
    wrap(writer, "commit_manifest", "manifest commit (add)")
    wrap(merge, "commit_manifest", "manifest commit (merge)")
    wrap(writer, "sum_file", "xxh3 of segment files (add)")
    wrap(merge, "sum_file", "xxh3 of segment files (merge)")
    wrap(merge, "write_merged", "merge: write the merged segment (all)")
    return totals


def build_round(path: Path, n: int, old: bool, totals: dict) -> dict:
    import bench_scale
    from polyindex.index.dense import kind as dense_kind
    from polyindex.index.lexical import kind as lexical_kind
    dense_kind.POLYSEMOUS, dense_kind.MERGE_CODES = old, not old
    lexical_kind.ANALYZE_COLUMNS = not old
    totals.clear()
    w0, c0 = time.perf_counter(), time.process_time()
    bench_scale.build(path, n, 384, "IVF1024,PQ48", False, True)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"path": "old" if old else "new", "wall_s": wall, "cpu_s": cpu,
            "docs_per_s_wall": n / wall, "docs_per_s_cpu": n / cpu,
            "phases": {k: {"wall_s": round(v[0], 2), "cpu_s": round(v[1], 2)}
                       for k, v in sorted(totals.items(), key=lambda kv: -kv[1][0])}}


MERGE = r"""
import json, sys, threading, time
import polyindex
from polyindex.index.dense import kind as dense_kind
def mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
path, seg, old = sys.argv[1], sys.argv[2], sys.argv[3] == "old"
dense_kind.POLYSEMOUS, dense_kind.MERGE_CODES = old, not old
eng = polyindex.open(path)
coll = eng.collection("c")
coll.count()
opened = mb("VmRSS")
# VmHWM counts the mapped pages of the source files too (page cache the kernel can drop):
# the private part is sampled (RssAnon every 20 ms: its peak, to within a sample)
anon, done = [mb("RssAnon")], threading.Event()
def sample():
    while not done.wait(0.02):
        anon.append(mb("RssAnon"))
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
report = coll.merge([seg])
done.set()
print(json.dumps({"rss_open_mb": opened, "rss_peak_mb": mb("VmHWM"),
                  "anon_open_mb": anon[0], "anon_peak_mb": max(anon),
                  "seconds": time.perf_counter() - t0, "rows": report["rows"]}))
eng.close()
"""


def merge_rss(src: Path, work: Path, delete: int) -> list[dict]:
    import numpy as np
    import polyindex
    out = []
    for path_kind in ("old", "new"):
        dst = work / f"merge-{src.name}"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        with polyindex.open(dst) as eng:
            coll = eng.collection("c")
            seg = max(coll.view().segments, key=lambda s: s.docs.n_rows)
            ids = seg.docs.table.column("id")
            rows = np.random.default_rng(0).choice(len(ids), delete, replace=False)
            coll.delete(ids.take(rows).to_pylist())
            seg_id, n_rows = seg.docs.id, seg.docs.n_rows
        run = subprocess.run([sys.executable, "-c", MERGE, str(dst), seg_id, path_kind],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "POLYINDEX_MERGE_EMBEDDED": "0"})
        res = json.loads(run.stdout.strip().splitlines()[-1])
        res.update(path=path_kind, segment_rows=n_rows)
        console.print(f"  merge of {n_rows:,} rows ({path_kind}): peak RSS "
                      f"{res['rss_peak_mb']:,.0f} MB (open {res['rss_open_mb']:,.0f} MB), private "
                      f"{res['anon_peak_mb']:,.0f} MB (open {res['anon_open_mb']:,.0f} MB), "
                      f"{res['seconds']:.1f} s", highlight=False)
        out.append(res)
        shutil.rmtree(dst, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--merge-rss", type=Path, action="append", default=[])
    ap.add_argument("--delete", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=WORK / "bulk")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    res = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.build:
        totals = _phases()
        rounds = []
        for r in range(args.rounds):
            for old in (True, False):
                rounds.append(build_round(args.work / "build", args.docs, old, totals))
                x = rounds[-1]
                console.print(f"  round {r}, {x['path']}: {x['wall_s']:.0f} s wall, "
                              f"{x['cpu_s']:.0f} s CPU, {x['docs_per_s_wall']:,.0f} docs/s",
                              highlight=False)
                console.print(json.dumps(x["phases"]), highlight=False)
        res["builds"] = rounds
        by = {p: [x for x in rounds if x["path"] == p] for p in ("old", "new")}
        console.print(table(f"bulk build of {args.docs:,} documents (lexical + IVF1024,PQ48)",
                            ["path", "wall s", "CPU s", "docs/s wall", "docs/s CPU"],
                            [[p, *(f"{sum(x[k] for x in v) / len(v):,.1f}"
                                   for k in ("wall_s", "cpu_s", "docs_per_s_wall",
                                             "docs_per_s_cpu"))] for p, v in by.items()]))
        res["speedup_wall"] = (sum(x["wall_s"] for x in by["old"])
                               / sum(x["wall_s"] for x in by["new"]))
        res["speedup_cpu"] = sum(x["cpu_s"] for x in by["old"]) / sum(x["cpu_s"] for x in by["new"])
        console.print(f"new / old: {res['speedup_wall']:.2f}x faster by wall time, "
                      f"{res['speedup_cpu']:.2f}x by CPU time", highlight=False)
    if args.merge_rss:
        res["merges"] = [m for src in args.merge_rss
                         for m in merge_rss(src, args.work, args.delete)]
    save_results("bench_bulk", res)


if __name__ == "__main__":
    main()
