"""Data operations cost the page, not the corpus: a scroll page (100 documents, with and
without a filter), ``count`` with a filter and ``delete_where`` of a few documents, in a
collection of ``--small`` documents and one of ``--big``, each timed against ``get`` of 100
ids (the reference: a lookup that costs what it returns) in interleaved rounds in this
process. Also the export's rate (documents/s) against a plain scroll of the same pages.

Both are lexical collections of generated text (``model=None``) with a declared ``year:int``,
bulk-built in ``--segment`` chunks (so the big one has many segments). Reported: per
collection the median of each operation, its ratio to the reference, and big / small.
Writes bench/results/bench_data_ops.json.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import WORK, console, save_results, table  # noqa: E402


def build(path: Path, n: int, segment: int, rng) -> None:
    import polyindex
    shutil.rmtree(path, ignore_errors=True)
    words = [f"w{i}" for i in range(2000)]
    with polyindex.open(path) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None, fields={"year": "int"},
                                     segment_size=segment)
        for s in range(0, n, segment):
            m = min(segment, n - s)
            picks = rng.integers(0, len(words), size=(m, 12))
            coll.add([{"id": f"d{s + i}", "text": " ".join(words[w] for w in picks[i]),
                       "year": int(rng.integers(1900, 2100))} for i in range(m)])
        console.print(f"  built {path.name}: {n:,} documents", highlight=False)


def time_once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=2_000)
    ap.add_argument("--big", type=int, default=200_000)
    ap.add_argument("--segment", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--work", type=Path, default=WORK / "data_ops")
    ap.add_argument("--reuse", action="store_true",
                    help="keep collections a former run built (its deletes included)")
    args = ap.parse_args()
    import polyindex
    from polyindex.ingest.export import export
    rng = np.random.default_rng(0)
    sizes = {"small": args.small, "big": args.big}
    colls, engines = {}, []
    for name, n in sizes.items():
        if not (args.reuse and (args.work / name).is_dir()):
            build(args.work / name, n, min(args.segment, n), rng)
        eng = polyindex.open(args.work / name)
        engines.append(eng)
        colls[name] = eng.collection("c")
    flt = {"year": {"gte": 2000}}
    ops = {
        "get 100 ids (reference)": lambda c, r: c.get([f"d{i}" for i in r.integers(0, c.n, 100)]),
        "scroll page of 100": lambda c, r: c.scroll(limit=100, cursor=c.cursor),
        "scroll page of 100, filtered": lambda c, r: c.scroll(limit=100, filter=flt,
                                                              cursor=c.cursor),
        "count with a filter": lambda c, r: c.count({"year": {"lt": int(r.integers(1900, 2100))}}),
    }
    # deletes change the live masks, which the cached filter masks are keyed by: their own
    # rounds, after the reads (still interleaved with the reference)
    writes = {"get 100 ids (reference)": ops["get 100 ids (reference)"],
              "delete_where (a few)": lambda c, r: c.delete_where(
                  {"year": int(r.integers(1900, 2100)), "and": [{"year": {"gte": 0}}]})}
    for name, c in colls.items():
        c.n = sizes[name]
        c.cursor = c.scroll(limit=1000).cursor  # a page in the middle, not the first
    rows, result = [], {}
    for phase in (ops, writes):
        _measure(phase, colls, args.rounds, rows, result)
    console.print(table(f"data operations: {args.small:,} vs {args.big:,} documents "
                        f"(median of {args.rounds} interleaved rounds)",
                        ["operation", "small ms", "big ms", "/get small", "/get big",
                         "big/small"], rows))
    big = colls["big"]
    n_big = big.count()
    t_scroll = time_once(lambda: _scroll_all(big))
    out = args.work / "big.parquet"
    t_export = time_once(lambda: export(out, big.info(), n_big, big.scroll))
    console.print(f"export of {n_big:,} documents: {n_big / t_export:,.0f} docs/s "
                  f"(a plain scroll of 1,000-document pages: {n_big / t_scroll:,.0f} docs/s; "
                  f"export / scroll time {t_export / t_scroll:.2f}); "
                  f"{out.stat().st_size / 1e6:.1f} MB", highlight=False)
    result["export"] = {"documents": n_big, "export_docs_per_s": n_big / t_export,
                        "scroll_docs_per_s": n_big / t_scroll, "bytes": out.stat().st_size}
    for eng in engines:
        eng.close()
    save_results("bench_data_ops", {"small": args.small, "big": args.big,
                                    "rounds": args.rounds, "results": result})


def _measure(ops: dict, colls: dict, rounds: int, rows: list, result: dict) -> None:
    times = {name: {op: [] for op in ops} for name in colls}
    for rnd in range(rounds):  # interleaved: both sizes and every op each round
        for op, fn in ops.items():
            for name, c in colls.items():
                times[name][op].append(time_once(lambda: fn(c, np.random.default_rng(rnd))))
    med = {name: {op: statistics.median(ts) for op, ts in per.items()}
           for name, per in times.items()}
    for op in ops:
        ref = {name: med[name]["get 100 ids (reference)"] for name in colls}
        r_small, r_big = med["small"][op] / ref["small"], med["big"][op] / ref["big"]
        rows.append([op, f"{med['small'][op] * 1e3:.2f}", f"{med['big'][op] * 1e3:.2f}",
                     f"{r_small:.2f}", f"{r_big:.2f}", f"{med['big'][op] / med['small'][op]:.2f}"])
        result.setdefault(op, []).append(
            {"small_ms": med["small"][op] * 1e3, "big_ms": med["big"][op] * 1e3,
             "ratio_to_get_small": r_small, "ratio_to_get_big": r_big})


def _scroll_all(coll) -> None:
    cursor = None
    while True:
        page = coll.scroll(limit=1000, cursor=cursor)
        if page.cursor is None:
            return
        cursor = page.cursor


if __name__ == "__main__":
    main()
