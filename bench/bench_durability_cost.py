"""What the durability work costs: acknowledged-upsert throughput and bulk indexing docs/s,
this checkout against a reference commit (default: the one before issue 16), side by side.

The reference is checked out into a temporary git worktree and imported from there (its
``polyindex`` namespace mapped the way setuptools maps ours); both run the same workload in
alternating rounds in fresh subprocesses, so machine noise hits both alike. Reported: the
median of each, and the ratio current / reference (goal: at least 0.9, i.e. at most 10%
slower). Writes bench/results/bench_durability_cost.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
console = Console()

# Run in a child: import polyindex from TREE, measure, print one JSON line.
CHILD = r'''
import importlib.util, json, sys, tempfile, time
from pathlib import Path
tree = Path(sys.argv[1]); what = sys.argv[2]; n = int(sys.argv[3])
ROOMS = {"polyindex": "engine", "polyindex.index": "index", "polyindex.rerank": "rerank",
         "polyindex.proto": "proto", "polyindex.cuda": "cuda"}
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name in ROOMS:
            folder = tree / ROOMS[name]
            return importlib.util.spec_from_file_location(
                name, folder / "__init__.py", submodule_search_locations=[str(folder)])
sys.meta_path.insert(0, Finder())
import polyindex
assert polyindex.__file__.startswith(str(tree)), polyindex.__file__
data = Path(tempfile.mkdtemp())
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
def text(i):
    return " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(60))
if what == "upsert":
    eng = polyindex.open(data, online=True)
    coll = eng.create_collection("c", ["lexical"])
    coll.add([{"id": "warm", "text": text(0)}])
    t0 = time.perf_counter()
    for b in range(n):
        coll.add([{"id": f"d{b}-{i}", "text": text(b * 10 + i)} for i in range(10)])
    rate = n / (time.perf_counter() - t0)
    eng.close()
else:
    src = data / "corpus.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": text(i)}) + "\n" for i in range(n)))
    eng = polyindex.open(data / "D")
    coll = eng.create_collection("c", ["lexical"], segment_size=max(n // 4, 1))
    t0 = time.perf_counter()
    coll.index(src)
    rate = n / (time.perf_counter() - t0)
    eng.close()
print(json.dumps({"rate": rate}))
'''


def measure(tree: Path, what: str, n: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), what, str(n)],
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{tree} {what}: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="3be55bb", help="reference commit (before issue 16)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--upserts", type=int, default=300, help="acknowledged 10-doc batches")
    ap.add_argument("--bulk-docs", type=int, default=20_000)
    args = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref_tree),
                        args.ref], check=True, capture_output=True)
        try:
            rows = {}
            for what, unit, n in (("upsert", "acked batches/s", args.upserts),
                                  ("bulk", "docs/s", args.bulk_docs)):
                cur, ref = [], []
                for r in range(args.rounds):
                    order = [(ROOT, cur), (ref_tree, ref)] if r % 2 == 0 else \
                        [(ref_tree, ref), (ROOT, cur)]
                    for tree, out in order:
                        out.append(measure(tree, what, n))
                    console.print(f"{what} round {r + 1}/{args.rounds}: current {cur[-1]:,.1f}, "
                                  f"reference {ref[-1]:,.1f} {unit} (load "
                                  f"{os.getloadavg()[0]:.2f})")
                rows[what] = {"unit": unit, "current": statistics.median(cur),
                              "reference": statistics.median(ref),
                              "ratio": statistics.median(cur) / statistics.median(ref),
                              "rounds_current": cur, "rounds_reference": ref}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(ref_tree)], capture_output=True)
    load1 = os.getloadavg()
    table = Table(title=f"durability cost: this checkout vs {args.ref} (median of "
                        f"{args.rounds} alternating rounds; load average {load0[0]:.2f} at "
                        f"start, {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f} at end)")
    for col in ("workload", "current", "reference", "ratio (goal >= 0.9)"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    for what, r in rows.items():
        table.add_row(f"{what} ({r['unit']})", f"{r['current']:,.1f}", f"{r['reference']:,.1f}",
                      f"{r['ratio']:.3f}")
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_durability_cost.json").write_text(json.dumps(
        {"ref": args.ref, "command": sys.argv, "loadavg_start": load0, "loadavg_end": load1,
         **rows}, indent=1))


if __name__ == "__main__":
    main()
