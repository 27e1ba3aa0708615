"""Evaluation: run queries through a profile, write a TREC run, score it with ir-measures."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import ir_measures
from ir_measures import AP, RR, R, nDCG

from polyindex.ingest.progress import progress_bar

MEASURES = [nDCG @ 10, R @ 100, RR @ 10, AP]
MEASURE_NAMES = {str(nDCG @ 10): "nDCG@10", str(R @ 100): "R@100", str(RR @ 10): "MRR@10",
                 str(AP): "MAP"}
BATCH = 64


def run_queries(collection, queries: Sequence[tuple[str, str]], *, profile: str | None, k: int,
                progress: bool = False) -> dict[str, list[tuple[str, float]]]:
    """qid -> ranked [(doc id, score)], batched so query encoding runs in batches too."""
    run: dict[str, list[tuple[str, float]]] = {}
    with progress_bar(f"querying ({profile or 'default'})", len(queries), "queries",
                      enabled=progress) as advance:
        for start in range(0, len(queries), BATCH):
            chunk = queries[start:start + BATCH]
            results = collection.query_batch([t for _, t in chunk], k=k, profile=profile)
            for (qid, _), hits in zip(chunk, results):
                run[qid] = [(h.id, h.score) for h in hits]
            advance(len(chunk))
    return run


def trec_lines(run: dict[str, list[tuple[str, float]]], tag: str) -> Iterable[str]:
    for qid, hits in run.items():
        for rank, (doc_id, score) in enumerate(hits, 1):
            yield f"{qid} Q0 {doc_id} {rank} {score:.6f} {tag}\n"


def write_trec(path: Path, run: dict[str, list[tuple[str, float]]], tag: str) -> None:
    with open(path, "w") as f:
        f.writelines(trec_lines(run, tag))


def evaluate_run(run_path: Path, qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """Mean measures of a TREC run file over the judged queries; a judged query without hits
    counts as zero. Per-query values are summed here because whether ir-measures reports a
    query absent from the run (as 0) or leaves it out depends on the measure's provider."""
    judged = set(qrels)
    run = [r for r in ir_measures.read_trec_run(str(run_path)) if r.query_id in judged]
    sums = {str(m): 0.0 for m in MEASURES}
    for m in ir_measures.iter_calc(MEASURES, qrels, run):
        sums[str(m.measure)] += float(m.value)
    n = len(judged)
    return {MEASURE_NAMES[k]: (v / n if n else 0.0) for k, v in sums.items()}
