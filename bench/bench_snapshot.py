"""What a snapshot and a restore cost against copying the same files by hand.

A vectors-only collection (``lexical`` + ``dense``, ``--docs`` generated documents with a
``--dim``-d vector each, in ``--segment-size`` segments: nothing to encode) is built once.
Then, for ``--rounds`` interleaved rounds (the same load from anything else on the machine
for each): ``Collection.snapshot(path)`` (copy), ``snapshot(path, link=True)`` (hard links),
``Engine.restore_snapshot`` (verify every file, then copy), and the reference: every file of
the collection folder copied with ``shutil.copyfile`` and fsynced (what a careful ``cp`` and
``sync`` do, with no checksums). Reports the median seconds and each one's ratio to the
reference. Then (``--write-rounds``) the collection is opened online and a thread writes
batches of 10 documents without pause while the main thread alternates a quiet window and a
window in which a snapshot is taken (the seal first, then the copy): the p50 and p99 latency of
the writes acknowledged in each kind of window, and their ratio (does a snapshot hold writes
up?). Writes bench/results/bench_snapshot.json.
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


def reference_copy(src: Path, dst: Path) -> None:
    for p in sorted(src.rglob("*")):
        target = dst / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, target)
        fd = os.open(target, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=40_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--segment-size", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-rounds", type=int, default=4)
    args = ap.parse_args()
    from polyindex.engine import Engine
    work = WORK / "bench_snapshot"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(5000)]
    eng = Engine(work / "data")
    coll = eng.create_collection("c", ["lexical", "dense"], model=None,
                                 segment_size=args.segment_size)
    t0 = time.perf_counter()
    for s in range(0, args.docs, args.segment_size):
        n = min(args.segment_size, args.docs - s)
        words = rng.integers(0, len(vocab), size=(n, 40))
        vecs = rng.standard_normal((n, args.dim)).astype(np.float32)
        coll.add([{"id": f"d{s + i}", "text": " ".join(vocab[w] for w in words[i]),
                   "vector": vecs[i]} for i in range(n)])
    console.print(f"built {args.docs:,} documents in {time.perf_counter() - t0:.1f} s")
    folder = work / "data" / "c"
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    times: dict[str, list[float]] = {"reference copy + fsync": [], "snapshot (copy)": [],
                                     "snapshot (--link)": [], "restore": []}
    for r in range(args.rounds):
        t = time.perf_counter()
        reference_copy(folder, work / f"ref{r}")
        times["reference copy + fsync"].append(time.perf_counter() - t)
        t = time.perf_counter()
        coll.snapshot(work / f"snap{r}")
        times["snapshot (copy)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        coll.snapshot(work / f"link{r}", link=True)
        times["snapshot (--link)"].append(time.perf_counter() - t)
        with Engine(work / f"restored{r}") as other:
            t = time.perf_counter()
            other.restore_snapshot(work / f"snap{r}")
            times["restore"].append(time.perf_counter() - t)
        for p in (f"ref{r}", f"snap{r}", f"link{r}", f"restored{r}"):
            shutil.rmtree(work / p)
    eng.close()
    writes = writes_during_snapshots(work, args)
    ref = statistics.median(times["reference copy + fsync"])
    rows = [(name, f"{statistics.median(v):.3f}", f"{statistics.median(v) / ref:.2f}x")
            for name, v in times.items()]
    console.print(table(f"snapshot and restore of {args.docs:,} documents ({size / 1e6:.1f} MB, "
                        f"{-(-args.docs // args.segment_size)} segments), median of "
                        f"{args.rounds} rounds", ["what", "seconds", "vs reference"], rows))
    if writes:
        console.print(table("write latency (batches of 10) while snapshots run vs quiet "
                            "windows, interleaved", ["window", "writes", "p50 ms", "p99 ms"],
                            [(k, v["n"], f"{v['p50'] * 1e3:.1f}", f"{v['p99'] * 1e3:.1f}")
                             for k, v in writes.items()]))
    save_results("bench_snapshot", {"args": vars(args), "bytes": size, "writes": writes,
                                    "seconds": times, "median_ratio_to_reference": {
                                        name: statistics.median(v) / ref
                                        for name, v in times.items()}})
    shutil.rmtree(work, ignore_errors=True)


def writes_during_snapshots(work: Path, args) -> dict:
    """Writes acknowledged in quiet windows vs windows with a snapshot, interleaved."""
    import threading
    from polyindex.engine import Engine
    if args.write_rounds < 1:
        return {}
    eng = Engine(work / "data", online=True)
    coll = eng.collection("c")
    lat: list[tuple[float, float]] = []  # (acknowledged at, seconds)
    stop = threading.Event()
    rng = np.random.default_rng(1)

    def writer():
        i = 0
        while not stop.is_set():
            docs = [{"id": f"w{i}-{j}", "text": f"written {i} {j}",
                     "vector": rng.standard_normal(args.dim).astype(np.float32)}
                    for j in range(10)]
            t = time.perf_counter()
            coll.add(docs)
            lat.append((time.perf_counter(), time.perf_counter() - t))
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    windows: dict[str, list[tuple[float, float]]] = {"quiet": [], "snapshot": []}
    try:
        time.sleep(1.0)
        for r in range(args.write_rounds):
            t = time.perf_counter()
            time.sleep(1.5)
            windows["quiet"].append((t, time.perf_counter()))
            t = time.perf_counter()
            coll.snapshot(work / f"w{r}")
            windows["snapshot"].append((t, time.perf_counter()))
            shutil.rmtree(work / f"w{r}")
    finally:
        stop.set()
        thread.join()
        eng.close()
    out = {}
    for name, spans in windows.items():
        got = sorted(d for at, d in lat if any(a <= at <= b for a, b in spans))
        if got:
            out[name] = {"n": len(got), "p50": got[len(got) // 2],
                         "p99": got[min(len(got) - 1, int(0.99 * len(got)))],
                         "window_s": sum(b - a for a, b in spans)}
    return out


if __name__ == "__main__":
    main()
