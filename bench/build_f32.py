"""Build bench/.work/engine/<name> (lexical + dense) with float32 embeddings (issue 23).

On this AVX2-only CPU bfloat16 MiniLM encodes ~5x slower than float32, so the sparse benches
build their collections with ``create_collection(..., dtype="float32")`` through the Python
API (the CLI has no dtype option); common.stored_collection then reads them as bench_quality's.

Usage: ``python bench/build_f32.py [--kinds lexical,dense,multivector] NAME...`` (into
``$BUILD_DATA`` when set; the default kinds are the engine's, lexical + dense).
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# another data folder (built beside a running build, moved in after): one writer per folder
DATA = Path(os.environ.get("BUILD_DATA", common.ENGINE_DATA))


def build(name: str, kinds: list[str] | None = None) -> None:
    import polyindex
    folder = common.collection_folder(name)
    if folder is None:
        print(f"SKIP {name}: not in {common.DATA}")
        return
    n = len(common.read_corpus(folder)[0])
    if common._complete(DATA / name, n):
        print(f"{name}: already built ({n} docs)")
        return
    eng = polyindex.open(DATA)
    coll = eng.create_collection(name, *([kinds] if kinds else []), dtype="float32",
                                 exist_ok=True)
    t = time.time()
    coll.index(common.corpus_file(folder))
    print(f"{name}: {n} docs in {time.time() - t:.0f}s", flush=True)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--kinds", default="", help="index kinds, comma-separated")
    args = ap.parse_args()
    for name in args.names:
        build(name, common.parse_list(args.kinds) or None)
