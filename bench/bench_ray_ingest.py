"""Ray ingestion (``polyindex index --ray --encoders N``) vs the single-process bulk path,
measured in the same run, end to end through the CLI (a fresh process each: model load, and
for Ray its start, included), and whether each Ray collection equals the bulk one.

Corpora: ``--collections`` (BEIR from the shared data, first ``--limit`` documents, the real
model, lexical + dense) and ``--generated N`` (synthetic text with the Zipf vocabulary of
bench_memory and random 384-d user vectors in Parquet, ``--model none``: what the pipeline
costs without the encoder). Equal: same ids and count, stored dense vectors within bf16
tolerance (model) or exactly (user vectors), same lexical top-10 (ids) for 20 queries.

``python bench/bench_ray_ingest.py [--collections nfcorpus] [--limit 300] [--generated 20000]
[--encoders 1,2] [--segment-size 100]``
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
from common import WORK, console, parse_list, table  # noqa: E402

OUT = WORK / "ray_ingest"


def beir_subset(name: str, limit: int) -> tuple[Path, list[str], list[str]] | None:
    folder = common.collection_folder(name)
    if folder is None:
        console.print(f"SKIP {name}: not in {common.DATA}")
        return None
    lines = common._open_text(common.corpus_file(folder)).read().splitlines()
    lines = [x for x in lines if x.strip()][:limit or None]
    path = OUT / f"{name}-{len(lines)}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ids = sorted({str(json.loads(x).get("_id")) for x in lines})
    queries = [q for _, q in common.read_queries(folder)][:20]
    return path, ids, queries


def generated(n: int, dim: int = 384) -> tuple[Path, list[str]]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from bench_memory import generate
    text = OUT / f"generated-{n}.jsonl"
    if not text.exists():
        generate(n, text)
    path = OUT / f"generated-{n}.parquet"
    if not path.exists():
        rows = [json.loads(x) for x in text.read_text().splitlines()]
        rng = np.random.default_rng(7)
        vec = rng.standard_normal((n, dim), dtype=np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        pq.write_table(pa.table({
            "_id": [r["_id"] for r in rows], "title": [r["title"] for r in rows],
            "text": [r["text"] for r in rows],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), dim)}),
            path, row_group_size=4096)
    words = text.read_text().split(maxsplit=400)[1:400:20]
    return path, [w.strip('".,{}:') for w in words if w.isalpha()][:20] or ["the"]


def index(src: Path, data: Path, extra: list[str], seg: int, model: str | None,
          dtype: str | None = None) -> dict:
    shutil.rmtree(data, ignore_errors=True)
    args = ["index", str(src), "--data", str(data), "-c", "c", "--segment-size", str(seg),
            "--no-progress", "--json", *(["--model", model] if model else []),
            *(["--dtype", dtype] if dtype else []), *extra]
    out, wall = common.run_cli(args, timeout=7200)
    out["seconds"] = wall
    return out


def compare(a: Path, b: Path, ids: list[str], queries: list[str], atol: float) -> dict:
    """Ray's collection against bulk's: ids, vectors, lexical top-10."""
    import numpy as np
    from polyindex.engine import Engine
    ca = Engine(a, readonly=True).collection("c")
    cb = Engine(b, readonly=True).collection("c")
    same = ca.count() == cb.count() == len(ids)
    worst = 0.0
    for x, y in zip(ca.get(ids, with_vectors=True), cb.get(ids, with_vectors=True)):
        if y is None or (x.id, x.text) != (y.id, y.text):
            same = False
            continue
        worst = max(worst, float(np.abs(x.vectors["dense"] - y.vectors["dense"]).max()))
    lex = all([h.id for h in ca.query(q, k=10, profile="lexical")]
              == [h.id for h in cb.query(q, k=10, profile="lexical")] for q in queries)
    return {"equal": bool(same and lex and worst <= atol), "ids_equal": same,
            "lexical_equal": lex, "max_abs_vector_diff": worst}


def run_corpus(label: str, src: Path, ids: list[str], queries: list[str], encoders: list[int],
               seg: int, model: str | None, atol: float, dtype: str | None = None) -> list[dict]:
    bulk = index(src, OUT / "bulk", [], seg, model, dtype)
    n = bulk["documents"]
    rows = [{"corpus": label, "run": "bulk (1 process)", "docs": n, "seconds": bulk["seconds"],
             "docs_per_s": n / bulk["seconds"], "vs_bulk": 1.0, "equal": None}]
    for e in encoders:
        r = index(src, OUT / f"ray{e}", ["--ray", "--encoders", str(e)], seg, model, dtype)
        row = {"corpus": label, "run": f"ray, {e} encoder(s)", "docs": r["documents"],
               "seconds": r["seconds"], "docs_per_s": r["documents"] / r["seconds"],
               "vs_bulk": bulk["seconds"] / r["seconds"]}
        row.update(compare(OUT / "bulk", OUT / f"ray{e}", ids, queries, atol))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", default="nfcorpus")
    ap.add_argument("--limit", type=int, default=300, help="first N documents (0: all)")
    ap.add_argument("--generated", type=int, default=20000, help="0: none")
    ap.add_argument("--encoders", default="1,2")
    ap.add_argument("--segment-size", type=int, default=100)
    ap.add_argument("--dtype", default=None, help="model precision of the BEIR runs "
                    "(float32: several times faster on CPUs without bf16)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    encoders = [int(x) for x in parse_list(args.encoders)]
    rows = []
    for name in parse_list(args.collections):
        got = beir_subset(name, args.limit)
        if got:
            rows += run_corpus(f"{name} (first {len(got[1]):,}, model"
                               f"{', ' + args.dtype if args.dtype else ''})", *got, encoders,
                               args.segment_size, None, 2e-2, args.dtype)
    if args.generated:
        src, queries = generated(args.generated)
        seg = max(args.segment_size, args.generated // 8)
        ids = [f"d{i}" for i in range(args.generated)]
        rows += run_corpus(f"generated {args.generated:,} (user vectors)", src, ids, queries,
                           encoders, seg, "none", 0.0)
    console.print(table("Ray ingestion vs bulk (end to end, same run)",
                        ["corpus", "run", "docs", "s", "docs/s", "x bulk", "equal",
                         "max |dv|"],
                        [(r["corpus"], r["run"], r["docs"], f"{r['seconds']:.1f}",
                          f"{r['docs_per_s']:.1f}", f"{r['vs_bulk']:.2f}",
                          "-" if r["equal"] is None else ("yes" if r["equal"] else "NO"),
                          f"{r.get('max_abs_vector_diff', 0):.1e}") for r in rows]))
    common.save_results("bench_ray_ingest", {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
