"""The engine's half of ``polyindex adapt``: what re-encoding a collection and committing it
costs, against the raw encoder encoding the same texts in the same process (the reference).

    python bench/bench_adapt_store.py --collection cisi [--cache /work/cache/base] [--rounds 2]

Copies a lexical + dense collection from the shared cache (``polyindex index --data
/work/cache/base --collection NAME``), then per round: the raw ``Encoder.encode`` of every
document's text (reference), ``adapt`` with a stand-in learner (the base model with one layer
moved by seeded noise: learning's own cost is ``bench/bench_adapt.py``'s), and ``adapt
--revert``; the two adapt phases are re-encoding every segment plus the one commit. Prints a
table and writes JSON (``--out``). Learning is excluded on purpose: the ratio says what the
storage side adds on top of encoding (documents copied, indexes built, fsync, sums, commit).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


def stand_in_learner(texts, teacher, base_model, out_dir, recipe=None, progress=None,
                     device="cpu", seed=0, titles=None):
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(base_model, device="cpu")
    g = torch.Generator().manual_seed(1234 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "encoder.layer.5" in name and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save(str(out_dir))
    return {"learner": "stand-in"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default="cisi")
    ap.add_argument("--cache", type=Path, default=Path("/work/cache/base"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    src = args.cache / args.collection
    if not (src / "manifest.json").exists():
        sys.exit(f"no cached collection at {src}: build it with polyindex index --data "
                 f"{args.cache} --collection {args.collection} ../shared/data/{args.collection}")
    import polyindex
    from polyindex.adapt.run import adapt, corpus
    tmp = Path(tempfile.mkdtemp(dir=args.tmp))
    rows = []
    try:
        shutil.copytree(src, tmp / "data" / args.collection)
        eng = polyindex.open(tmp / "data")
        coll = eng.collection(args.collection)
        _, texts, _ = corpus(coll.view())
        n = len(texts)
        enc = coll.encoding.encoder
        enc.encode(texts[:64])  # warm
        for r in range(args.rounds):
            t0 = time.perf_counter()
            enc.encode(texts)
            ref = time.perf_counter() - t0
            a = adapt(coll, learner=stand_in_learner)
            b = adapt(coll, revert=True)
            rows.append({"round": r, "documents": n, "reference_encode_s": round(ref, 2),
                         "adapt_reencode_commit_s": a["seconds"]["reencode_and_commit"],
                         "revert_reencode_commit_s": b["seconds"]["reencode_and_commit"]})
            # a second round adapts from base again: the revert left it there
        eng.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'round':>5} {'docs':>6} {'encode (ref) s':>15} {'adapt s':>8} {'revert s':>9} "
          f"{'ratio':>6} {'s / 10k docs':>13}")
    for row in rows:
        ratio = row["revert_reencode_commit_s"] / row["reference_encode_s"]
        per10k = row["revert_reencode_commit_s"] * 10_000 / row["documents"]
        row.update(ratio_revert_to_reference=round(ratio, 3), revert_s_per_10k=round(per10k, 1))
        print(f"{row['round']:>5} {row['documents']:>6} {row['reference_encode_s']:>15.1f} "
              f"{row['adapt_reencode_commit_s']:>8.1f} {row['revert_reencode_commit_s']:>9.1f} "
              f"{ratio:>6.2f} {per10k:>13.0f}")
    print(f"peak RSS of the process: {rss_mb:.0f} MB")
    out = {"collection": args.collection, "rounds": rows, "peak_rss_mb": round(rss_mb, 1)}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
