"""ANN speed and recall of user vectors: polyindex against raw FAISS, same parameters, same run.

Data: a generated set with the structure of real embeddings (``--n`` x ``--d``, default
1,000,000 x 384): points of a Gaussian mixture (``--clusters``) in a low-dimensional latent
space (``--intrinsic``, 32) mapped linearly to ``d`` dimensions, plus isotropic noise
(``--noise`` of the signal's per-dimension scale), L2-normalized; queries are held-out draws
of the same distribution. ``--hdf5 FILE`` runs an ANN-benchmarks file (train, test,
neighbors; angular sets) instead, when one is at hand (nothing is downloaded).

For each factory (``--indexes``, default ``HNSW32,Flat;IVF4096,PQ48``): build raw FAISS
(``index_factory`` + train + add) and a polyindex vectors-only collection of one segment
(bulk ``polyindex index`` of an Arrow IPC file, the zero-copy path) and report build time
and RSS growth; then sweep efSearch / nprobe and report recall@10 against exact neighbours
and queries/s, batched and one at a time, both single-threaded (polyindex's search threads),
measured interleaved. The verdict: at the first setting where both reach recall@10 >= 0.95,
polyindex's q/s >= 0.9x raw FAISS's. ``--filtered``: selectivities 50/10/1/0.1% by a
metadata filter; recall@10 against the exact top 10 of the allowed rows and q/s next to an
exact scan of those rows (faiss brute force with the allow bitmap, mask precomputed).

    nice -n 10 python bench/bench_ann.py --n 200000 --filtered
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import console, save_results, table, verdict  # noqa: E402

import polyindex  # noqa: E402

K = 10
SELECTIVITIES = (0.5, 0.1, 0.01, 0.001)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def generate(n: int, nq: int, d: int, intrinsic: int, clusters: int, noise: float, seed: int):
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((intrinsic, d)).astype(np.float32) / np.sqrt(intrinsic)
    centres = rng.standard_normal((clusters, intrinsic)).astype(np.float32) * 2.0
    scale = rng.uniform(0.5, 1.5, clusters).astype(np.float32)

    def draw(m):
        out = np.empty((m, d), np.float32)
        for s in range(0, m, 50_000):
            c = rng.integers(clusters, size=min(50_000, m - s))
            z = centres[c] + scale[c, None] * rng.standard_normal((len(c), intrinsic), np.float32)
            v = z @ basis + noise * rng.standard_normal((len(c), d), np.float32)
            out[s:s + len(c)] = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out
    return draw(n), draw(nq)


def exact_topk(x: np.ndarray, q: np.ndarray, k: int, allow: np.ndarray | None = None):
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    D = np.empty((len(q), k), np.float32)
    ids = np.empty((len(q), k), np.int64)
    sel = None if allow is None else faiss.IDSelectorBitmap(np.packbits(allow, bitorder="little"))
    faiss.knn_inner_product(faiss.swig_ptr(q), faiss.swig_ptr(x), x.shape[1], len(q), len(x), k,
                            faiss.swig_ptr(D), faiss.swig_ptr(ids), sel)
    faiss.omp_set_num_threads(1)
    return ids


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    # fewer allowed rows than k: the truth is -1 padded, only real neighbours count
    return float(np.mean([len(set(f[f >= 0].tolist()) & set(t[t >= 0].tolist()))
                          / max(1, int((t >= 0).sum())) for f, t in zip(found, truth)]))


def arrow_file(path: Path, x: np.ndarray) -> None:
    n, d = x.shape
    table_ = pa.table({"id": pa.array(np.arange(n).astype(str)),
                       "bucket": pa.array(np.arange(n) % 1000, pa.int64()),
                       "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), d)})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table_.schema) as w:
        w.write_table(table_, max_chunksize=65_536)


def knob_of(factory: str) -> str:
    return "nprobe" if factory.upper().startswith("IVF") else "efSearch"


def search_params(factory: str, value: int):
    return (faiss.SearchParametersIVF(nprobe=value) if knob_of(factory) == "nprobe"
            else faiss.SearchParametersHNSW(efSearch=value))


def timed(fn, reps: int = 1) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


ROUNDS = 2  # --rounds


def run_factory(factory, x, q, truth, arrow, work, values, n_single, filtered, rows_out):
    n = len(x)
    faiss.omp_set_num_threads(os.cpu_count() or 1)  # builds: every core, both sides
    r0 = rss_mb()
    t0 = time.perf_counter()
    raw = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not raw.is_trained:
        raw.train(x)
    raw.add(x)
    raw_build, raw_rss = time.perf_counter() - t0, rss_mb() - r0
    data = work / f"data-{factory.replace(',', '_')}"
    shutil.rmtree(data, ignore_errors=True)
    r0 = rss_mb()
    t0 = time.perf_counter()
    eng = polyindex.open(data)
    coll = eng.create_collection("ann", [f"dense:{factory}"], model=None, segment_size=n,
                                 fields={"bucket": "int"})
    coll.index(arrow)
    poly_build = time.perf_counter() - t0
    eng.close()
    eng = polyindex.open(data)  # a fresh open: what a server holds
    coll = eng.collection("ann")
    coll.query(vector=q[0], k=K, profile="dense")
    poly_rss = rss_mb() - r0
    faiss.omp_set_num_threads(1)
    knob = knob_of(factory)
    for v in values:
        coll.save_profile(f"p{v}", {"retrieve": [{"index": "dense", "k": K,
                                                 "params": f"{knob}={v}"}]})
    sweep = []
    qs = q[:n_single]
    for v in values:
        sp = search_params(factory, v)
        prof = f"p{v}"
        _, raw_ids = raw.search(q, K, params=sp)
        hits = coll.query_batch(vectors=list(q), k=K, profile=prof)
        poly_ids = np.array([[int(h.id) for h in hl] + [-1] * (K - len(hl)) for hl in hits])
        t = {}
        for rep in range(ROUNDS):  # interleaved, ABBA..., the best of each side kept
            order = ("raw", "poly") if rep % 2 == 0 else ("poly", "raw")
            for side in order:
                if side == "raw":
                    b = timed(lambda: raw.search(q, K, params=sp))
                    s = timed(lambda: [raw.search(qs[i:i + 1], K, params=sp) for i in range(len(qs))])
                else:
                    b = timed(lambda: coll.query_batch(vectors=list(q), k=K, profile=prof))
                    s = timed(lambda: [coll.query(vector=qs[i], k=K, profile=prof)
                                       for i in range(len(qs))])
                t[side] = (min(b, t.get(side, (b, s))[0]), min(s, t.get(side, (b, s))[1]))
        row = {"factory": factory, knob: v, "raw_recall": recall(raw_ids, truth),
               "poly_recall": recall(poly_ids, truth),
               "raw_qps_batch": len(q) / t["raw"][0], "poly_qps_batch": len(q) / t["poly"][0],
               "raw_qps_single": len(qs) / t["raw"][1], "poly_qps_single": len(qs) / t["poly"][1]}
        row["ratio_batch"] = row["poly_qps_batch"] / row["raw_qps_batch"]
        row["ratio_single"] = row["poly_qps_single"] / row["raw_qps_single"]
        row["overhead_us_single"] = 1e6 * (t["poly"][1] - t["raw"][1]) / len(qs)
        sweep.append(row)
    at = next((r for r in sweep if r["raw_recall"] >= 0.95 and r["poly_recall"] >= 0.95), None)
    out = {"factory": factory, "n": n, "raw_build_s": raw_build, "poly_build_s": poly_build,
           "raw_rss_mb": raw_rss, "poly_rss_mb": poly_rss, "sweep": sweep, "at_095": at}
    if filtered:
        out["filtered"] = run_filtered(coll, x, q[:n_single], knob, values, factory)
    rows_out.append(out)
    raw = None  # free the raw index before the next factory (lambdas above close over it)
    eng.close()
    return out


def run_filtered(coll, x, q, knob, values, factory):
    n = len(x)
    base = values[min(2, len(values) - 1)] if knob == "efSearch" else values[min(2, len(values) - 1)]
    prof = f"p{base}"
    out = []
    for s in SELECTIVITIES:
        lim = int(s * 1000)
        allow = (np.arange(n) % 1000) < lim
        truth = exact_topk(x, q, K, allow)
        flt = {"bucket": {"lt": lim}}
        hits = [coll.query(vector=v, k=K, profile=prof, filter=flt) for v in q]
        found = np.array([[int(h.id) for h in hl] + [-1] * (K - len(hl)) for hl in hits])
        poly_t = timed(lambda: [coll.query(vector=v, k=K, profile=prof, filter=flt) for v in q])
        D = np.empty((1, K), np.float32)
        ids = np.empty((1, K), np.int64)
        sel = faiss.IDSelectorBitmap(np.packbits(allow, bitorder="little"))

        def scan():
            for v in q:
                v = np.ascontiguousarray(v[None])
                faiss.knn_inner_product(faiss.swig_ptr(v), faiss.swig_ptr(x), x.shape[1], 1, n, K,
                                        faiss.swig_ptr(D), faiss.swig_ptr(ids), sel)
        exact_t = timed(scan)
        out.append({"factory": factory, "selectivity": s, "allowed": int(allow.sum()),
                    knob: base, "recall": recall(found, truth), "poly_qps": len(q) / poly_t,
                    "exact_scan_qps": len(q) / exact_t})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--queries", type=int, default=1000, help="queries (batched)")
    ap.add_argument("--single", type=int, default=300, help="queries run one at a time")
    ap.add_argument("--intrinsic", type=int, default=32)
    ap.add_argument("--clusters", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--indexes", default="HNSW32,Flat;IVF4096,PQ48", help="';'-separated")
    ap.add_argument("--ef", default="16,32,64,128,256")
    ap.add_argument("--nprobe", default="8,16,32,64,128")
    ap.add_argument("--filtered", action="store_true")
    ap.add_argument("--rounds", type=int, default=2,
                    help="interleaved timing rounds per setting (the best of each side is kept: "
                         "more rounds for a machine others share)")
    ap.add_argument("--hdf5", type=Path, default=None, help="an ANN-benchmarks file (angular)")
    args = ap.parse_args()
    global ROUNDS
    ROUNDS = args.rounds
    if args.hdf5 is not None:
        import h5py
        with h5py.File(args.hdf5) as f:
            x = np.ascontiguousarray(f["train"][...], np.float32)
            q = np.ascontiguousarray(f["test"][: args.queries], np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        dataset = {"hdf5": str(args.hdf5), "n": len(x), "d": x.shape[1]}
    else:
        x, q = generate(args.n, args.queries, args.d, args.intrinsic, args.clusters,
                        args.noise, args.seed)
        dataset = {"generated": True, "n": args.n, "d": args.d, "intrinsic": args.intrinsic,
                   "clusters": args.clusters, "noise": args.noise, "seed": args.seed}
    console.print(f"data: {dataset}; computing exact neighbours ...")
    truth = exact_topk(x, q, K)
    work = Path(tempfile.mkdtemp(prefix="bench_ann-"))
    results = []
    try:
        arrow = work / "vectors.arrow"
        arrow_file(arrow, x)
        for factory in filter(None, args.indexes.split(";")):
            values = [int(v) for v in (args.nprobe if knob_of(factory) == "nprobe"
                                       else args.ef).split(",")]
            console.print(f"{factory}: building ...")
            r = run_factory(factory, x, q, truth, arrow, work, values, args.single,
                            args.filtered, results)
            knob = knob_of(factory)
            console.print(table(
                f"{factory}, n={len(x):,}: build raw {r['raw_build_s']:.1f} s / polyindex "
                f"{r['poly_build_s']:.1f} s; RSS +{r['raw_rss_mb']:.0f} / +{r['poly_rss_mb']:.0f} MB",
                [knob, "recall raw", "recall poly", "q/s raw (batch)", "q/s poly (batch)", "ratio",
                 "q/s raw (1)", "q/s poly (1)", "ratio", "overhead us/q"],
                [[s[knob], f"{s['raw_recall']:.3f}", f"{s['poly_recall']:.3f}",
                  f"{s['raw_qps_batch']:.0f}", f"{s['poly_qps_batch']:.0f}", f"{s['ratio_batch']:.2f}",
                  f"{s['raw_qps_single']:.0f}", f"{s['poly_qps_single']:.0f}",
                  f"{s['ratio_single']:.2f}", f"{s['overhead_us_single']:.0f}"] for s in r["sweep"]]))
            at = r["at_095"]
            ok = None if at is None else (at["ratio_batch"] >= 0.9 and at["ratio_single"] >= 0.9)
            console.print(f"at recall@10 >= 0.95 ({knob}={at and at[knob]}): batched "
                          f"{at and round(at['ratio_batch'], 2)}x, one at a time "
                          f"{at and round(at['ratio_single'], 2)}x raw FAISS {verdict(ok)}")
            if r.get("filtered"):
                console.print(table(f"{factory} filtered ({knob}={r['filtered'][0][knob]}, one "
                                    "query at a time)",
                                    ["selectivity", "allowed rows", "recall@10", "q/s polyindex",
                                     "q/s exact scan", "PASS"],
                                    [[f"{f['selectivity']:.1%}", f"{f['allowed']:,}",
                                      f"{f['recall']:.3f}", f"{f['poly_qps']:.0f}",
                                      f"{f['exact_scan_qps']:.0f}", verdict(f["recall"] >= 0.95)]
                                     for f in r["filtered"]]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_results("bench_ann", {"dataset": dataset, "queries": len(q), "single": args.single,
                               "results": results,
                               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


if __name__ == "__main__":
    main()
