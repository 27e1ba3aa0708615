"""A cold ``polyindex query --profile lexical``: wall and CPU time of the whole CLI call in a
fresh process, beside references measured in the same run (issue 38 part 3).

Each round runs every case once, in a fresh interpreter, in an order that alternates
(ABBA), and the table gives each case's median wall and CPU (user + system of the child)
time and its ratio to ``python -c "import numpy, pyarrow"``. The collection is npl as a
lexical-only collection (``--index lexical --model none``), built once under
``bench/.work/cold``. A first query with an empty numba cache (``NUMBA_CACHE_DIR`` a fresh
folder: every kernel compiled, then cached) is measured apart, ``--first`` times.

    python bench/bench_cold_cli.py --rounds 11 --first 2 [--before CHECKOUT]

``--before DIR``: the same query run by other code in the same rounds, e.g. the code before a
change: ``DIR/.venv/bin/python`` when DIR is a checkout with its virtual environment, else
this interpreter with DIR (a folder holding a ``polyindex`` package) first on PYTHONPATH. Its
numba cache goes to a temporary folder (its bytecode is cached as any run's: a
PYTHONPYCACHEPREFIX made numba recompile at every call).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (WORK, collection_folder, console, median, polyindex_cmd,  # noqa: E402
                    save_results, table)

HEAVY = ("torch", "sentence_transformers", "transformers", "lightgbm", "ray", "faiss",
         "pandas", "scipy", "sklearn")
QUERY = "boundary layer transition at supersonic speeds"


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``cmd`` to its end (its output discarded)."""
    import time
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def build(data: Path, name: str) -> None:
    if (data / name / "manifest.json").exists():
        return
    src = collection_folder("npl")
    if src is None:
        raise SystemExit("SKIP: npl is not in the shared data (bench/README.md)")
    console.print(f"building {name}: npl, --index lexical --model none")
    subprocess.run([*polyindex_cmd(), "index", str(src), "--data", str(data), "-c", name,
                    "--index", "lexical", "--model", "none", "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)


def modules_loaded(query: list[str]) -> list[str]:
    """Which of ``HEAVY`` the query's process imported (the CLI's main run in-process)."""
    code = ("import sys, json\n"
            "sys.argv = ['polyindex'] + json.loads(sys.argv[1])\n"
            "from polyindex.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)),"
            " file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(query)], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--first", type=int, default=2, help="first queries with an empty numba cache")
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout whose .venv runs the same query as a reference")
    args = ap.parse_args()
    data = WORK / "cold"
    build(data, "npl_lexical")
    query = ["query", QUERY, "--data", str(data), "-c", "npl_lexical", "--profile", "lexical",
             "--k", "10", "--json"]
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import numpy, pyarrow'": [sys.executable, "-c", "import numpy, pyarrow"],
        "polyindex --version": [*polyindex_cmd(), "--version"],
        "polyindex query --profile lexical": [*polyindex_cmd(), *query],
    }
    envs: dict[str, dict | None] = {name: None for name in cases}
    scratch = Path(tempfile.mkdtemp(prefix="cold-cli-before-"))
    if args.before is not None:
        name = "before: polyindex query --profile lexical"
        venv = args.before / ".venv" / "bin" / "python"
        cases[name] = [str(venv) if venv.exists() else sys.executable, "-m",
                       "polyindex.cli.main", *query]
        envs[name] = {**os.environ, "NUMBA_CACHE_DIR": str(scratch / "numba"),
                      **({} if venv.exists() else {"PYTHONPATH": str(args.before)})}
        timed(cases[name], envs[name])  # its caches filled once
    timed(cases["polyindex query --profile lexical"][:])  # fill the numba cache once
    walls: dict[str, list[float]] = {c: [] for c in cases}
    cpus: dict[str, list[float]] = {c: [] for c in cases}
    order = list(cases)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            w, c = timed(cases[name], envs[name])
            walls[name].append(w)
            cpus[name].append(c)
        console.print(f"[dim]round {r + 1}/{args.rounds}[/dim]")
    first = []
    for _ in range(args.first):
        cache = Path(tempfile.mkdtemp(prefix="numba-cache-"))
        try:
            first.append(timed(cases["polyindex query --profile lexical"],
                               env={**os.environ, "NUMBA_CACHE_DIR": str(cache)}))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    ref = median(walls["python -c 'import numpy, pyarrow'"])
    rows, out = [], {}
    for name in cases:
        w, c = median(walls[name]), median(cpus[name])
        rows.append([name, f"{w:.3f}", f"{c:.3f}", f"{w / ref:.2f}x"])
        out[name] = {"wall_s": w, "cpu_s": c, "walls": walls[name], "cpus": cpus[name]}
    if first:
        fw, fc = median([f[0] for f in first]), median([f[1] for f in first])
        rows.append(["query, empty numba cache", f"{fw:.3f}", f"{fc:.3f}", f"{fw / ref:.2f}x"])
        out["query, empty numba cache"] = {"wall_s": fw, "cpu_s": fc, "runs": first}
    shutil.rmtree(scratch, ignore_errors=True)
    heavy = modules_loaded(query)
    console.print(table(f"cold CLI, median of {args.rounds} rounds (fresh processes)",
                        ["case", "wall s", "cpu s", "wall / import numpy, pyarrow"], rows))
    console.print(f"heavy modules the lexical query imported: {heavy or 'none'} "
                  f"(of {', '.join(HEAVY)})")
    save_results("bench_cold_cli", {"rounds": args.rounds, "cases": out,
                                    "heavy_modules_loaded": heavy,
                                    "load_average": os.getloadavg()})


if __name__ == "__main__":
    main()
