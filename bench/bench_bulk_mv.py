"""Bulk indexing with dense + multivector against dense alone (issue 39 part 1: <= 1.15x).

Runs ``polyindex index --data WORK/ROUND-CONFIG --collection NAME --dtype DTYPE --index
lexical --index dense [--index multivector] --no-progress SOURCE`` (the CLI's own code,
in a fresh child process per run, encoding from the texts) for each configuration,
alternating within each of ``--rounds`` rounds (ABBA), and reports each run's CPU time (the
child's user + system, every thread; the machine is shared, so wall time measures the
neighbours) and the ratio dense+mv / dense of the medians. Each run also times its phases by
CPU (wrappers around the functions that do the work: the encoder pass, each kind's train and
build, the codebook's training, assignment, residual codes, scales and files).

Usage: ``python bench/bench_bulk_mv.py --source /work/shared/data/medline [--rounds 1]
[--dtype float32] [--work /tmp/bench-bulk-mv]``. Writes bench/results/bench_bulk_mv.json.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONFIGS = {"dense": ["lexical", "dense"], "dense+mv": ["lexical", "dense", "multivector"]}


def _install_phases() -> dict:
    """Wrap the functions a bulk run spends its time in; returns {phase: [wall, cpu]}."""
    from polyindex.index.dense import kind as dense_kind
    from polyindex.index.lexical import kind as lexical_kind
    from polyindex.index.multivector import codec
    from polyindex.index.multivector import kind as mv_kind
    from polyindex.ingest import encoding
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

    wrap(encoding.Encoding, "_encode_docs", "encode: dense pass")
    wrap(encoding.Encoding, "_encode_docs_tokens", "encode: one pass, dense + tokens")
    wrap(lexical_kind.LexicalKind, "build", "lexical: build")
    wrap(dense_kind.DenseKind, "train", "dense: train")
    wrap(dense_kind.DenseKind, "build", "dense: build")
    wrap(mv_kind.MultivectorKind, "train", "multivector: train (all)")
    wrap(mv_kind.MultivectorKind, "build", "multivector: build (all)")
    wrap(codec, "train", "multivector: codebook training")
    wrap(codec.Codebook, "assign", "multivector: assignment (incl. training's)")
    wrap(codec.Codebook, "residual_codes", "multivector: residual codes")
    wrap(codec.Codebook, "scales", "multivector: scales")
    wrap(mv_kind, "write_segment", "multivector: files")
    return totals


def child(out: Path, cli_args: list[str]) -> None:
    """One run in this process: the CLI's ``index`` with the phase wrappers installed."""
    totals = _install_phases()
    from polyindex.cli.main import app
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        app(cli_args, standalone_mode=False)
    finally:
        out.write_text(json.dumps({
            "wall_s": time.perf_counter() - w0, "cpu_s_in_main": time.process_time() - c0,
            "phases": {k: {"wall_s": round(v[0], 2), "cpu_s": round(v[1], 2)}
                       for k, v in sorted(totals.items(), key=lambda kv: -kv[1][1])}}))


def run_one(work: Path, name: str, config: str, source: Path, dtype: str, tag: str) -> dict:
    data = work / f"{tag}-{config.replace('+', '_')}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    cli = ["index", "--data", str(data), "--collection", name, "--dtype", dtype]
    for k in CONFIGS[config]:
        cli += ["--index", k]
    cli += ["--no-progress", str(source)]
    report = data / "phases.json"
    w0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(report), "--", *cli],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    wall = time.perf_counter() - w0
    if proc.returncode:
        raise RuntimeError(f"polyindex {' '.join(cli)} failed:\n{err[-3000:]}")
    res = json.loads(report.read_text())
    res.update({"config": config, "command": "polyindex " + " ".join(cli), "wall_s": wall})
    return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one run: --child REPORT -- CLI ARGS
        child(Path(argv[1]), argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="a BEIR folder")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-bulk-mv"))
    args = ap.parse_args(argv)
    from common import save_results
    name = args.source.name
    runs = []
    for r in range(args.rounds):
        order = list(CONFIGS) if r % 2 == 0 else list(CONFIGS)[::-1]
        for config in order:
            t0 = (os.times().children_user, os.times().children_system)
            res = run_one(args.work, name, config, args.source, args.dtype, f"r{r}")
            t1 = os.times()
            res["cpu_s"] = (t1.children_user - t0[0]) + (t1.children_system - t0[1])
            res["load_avg"] = os.getloadavg()
            runs.append(res)
            print(f"round {r} {config}: cpu {res['cpu_s']:.1f} s, wall {res['wall_s']:.1f} s, "
                  f"load {res['load_avg'][0]:.1f}", flush=True)
            for ph, v in res["phases"].items():
                print(f"    {ph:45s} cpu {v['cpu_s']:7.2f}  wall {v['wall_s']:7.2f}", flush=True)
    med = {c: sorted(x["cpu_s"] for x in runs if x["config"] == c) for c in CONFIGS}
    med = {c: v[len(v) // 2] for c, v in med.items()}
    ratio = med["dense+mv"] / med["dense"]
    print(f"{name} ({args.dtype}): CPU dense {med['dense']:.1f} s, dense+mv "
          f"{med['dense+mv']:.1f} s: {ratio:.3f}x (target <= 1.15)")
    save_results("bench_bulk_mv", {"collection": name, "dtype": args.dtype,
                                   "median_cpu_s": med, "ratio": ratio, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
