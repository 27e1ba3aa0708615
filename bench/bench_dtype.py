"""Encoding speed of the model in bfloat16 vs float32 on this machine, and what ``auto``
picks here (issue 41 part 5): interleaved rounds of the same texts, ratio float32/bfloat16,
and the cosine between the two precisions' embeddings (comparability).

    python bench/bench_dtype.py [--docs 64] [--passes 3] [--collection medline]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from common import (collection_folder, console, doc_text, interleaved, median, read_corpus,
                    save_results, table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--collection", default="medline")
    args = ap.parse_args()
    import torch
    from polyindex.encode.precision import choose
    from polyindex.encode.text import Encoder
    folder = collection_folder(args.collection)
    if folder is None:
        console.print(f"[yellow]no {args.collection} collection in the shared data: nothing "
                      "measured[/yellow]")
        return
    _, titles, texts = read_corpus(folder)
    docs = [doc_text(t, x) for t, x in zip(titles[:args.docs], texts[:args.docs])]
    enc = {d: Encoder("all-MiniLM-L6-v2", d) for d in ("float32", "bfloat16")}
    for e in enc.values():
        e.encode(docs[:8])  # warm

    def timed(dtype):
        def run():
            t = time.perf_counter()
            enc[dtype].encode(docs)
            return len(docs) / (time.perf_counter() - t)
        return run
    rates = interleaved({d: timed(d) for d in enc}, args.passes)
    a, b = enc["bfloat16"].encode(docs), enc["float32"].encode(docs)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    auto, why = choose("cpu")
    f32, bf16 = median(rates["float32"]), median(rates["bfloat16"])
    console.print(table(f"encoding {len(docs)} {args.collection} documents, "
                        f"{torch.get_num_threads()} threads, {args.passes} interleaved passes",
                        ["dtype", "docs/s (median)", "passes"],
                        [[d, f"{median(r):.1f}", ", ".join(f"{x:.1f}" for x in r)]
                         for d, r in rates.items()]))
    console.print(f"float32 / bfloat16 = {f32 / bf16:.2f}x; min cosine {cos.min():.6f}; "
                  f"auto picks {auto} ({why})")
    save_results("bench_dtype", {"docs": len(docs), "threads": torch.get_num_threads(),
                                 "rates": rates, "ratio_f32_over_bf16": f32 / bf16,
                                 "min_cosine": float(cos.min()), "auto": auto, "why": why})


if __name__ == "__main__":
    main()
