"""Evaluation: run queries through a profile, write a TREC run, score it with ir-measures."""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Iterable, Sequence

import ir_measures
from ir_measures import AP, RR, R, nDCG

from polyindex.errors import InputError, InvalidArgument
from polyindex.ingest.progress import progress_bar

MEASURES = [nDCG @ 10, R @ 100, RR @ 10, AP]
MEASURE_NAMES = {str(nDCG @ 10): "nDCG@10", str(R @ 100): "R@100", str(RR @ 10): "MRR@10",
                 str(AP): "MAP"}
BATCH = 64


def _by_lowercase() -> dict[str, str]:
    from ir_measures.measures import registry
    out: dict[str, str] = {}
    for name in registry:  # the first spelling wins (nDCG before NDCG)
        out.setdefault(name.lower(), name)
    return out


def _parse_one(spec: str) -> list:
    """One measure: ir-measures' own syntax, its name in any case (``ndcg@10``, ``map``,
    ``mrr@10``), or a TREC name (``ndcg_cut_10``)."""
    try:
        return [ir_measures.parse_measure(spec)]
    except (NameError, ValueError, SyntaxError, TypeError):
        pass
    m = re.match(r"([^@(_]+)(.*)", spec.strip())
    name = _by_lowercase().get(m.group(1).lower()) if m else None
    if name is not None:
        try:
            return [ir_measures.parse_measure(name + m.group(2))]
        except (NameError, ValueError, SyntaxError, TypeError):
            pass
    try:
        return list(ir_measures.parse_trec_measure(spec))
    except (NameError, ValueError, SyntaxError, TypeError, KeyError):
        pass
    head = m.group(1) if m else spec
    close = difflib.get_close_matches(head.lower(), list(_by_lowercase()), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(_by_lowercase()[c] + (m.group(2) if m else '') for c in close)}? " \
        if close else ""
    raise InvalidArgument(f"--measure {spec!r} is not an ir-measures measure ({hint}e.g. "
                          "nDCG@10, P@5, R@1000, RR@10, AP, Judged@10, in any case, or a TREC "
                          "name such as ndcg_cut_10)")


def parse_measures(specs: Sequence[str] | None) -> list:
    """ir-measures measures from their names (``nDCG@10``, ``P@5``, ``R@1000``, ``RR``,
    ``Judged@10``, case-insensitively, TREC names like ``ndcg_cut_10``...); none given: the
    default four."""
    if not specs:
        return list(MEASURES)
    return [m for spec in specs for m in _parse_one(spec)]


def measure_name(measure) -> str:
    return MEASURE_NAMES.get(str(measure), str(measure))


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


def read_run(path: Path) -> list:
    """A TREC run file (``qid Q0 docid rank score tag``) as ir-measures ScoredDocs; a bad
    line is an InputError naming it (ir-measures' own reader would fail without one)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument(f"{path}: no such run file")
    out = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                fields = raw.decode("utf-8").split()
            except UnicodeDecodeError as e:
                raise InputError(f"invalid UTF-8: {e.reason}", source=str(path), line=lineno) from None
            if not fields:
                continue
            if len(fields) != 6:
                raise InputError(f"expected 6 columns (qid Q0 docid rank score tag), got "
                                 f"{len(fields)}", source=str(path), line=lineno)
            try:
                score = float(fields[4])
            except ValueError:
                raise InputError(f"score must be a number, got {fields[4]!r}",
                                 source=str(path), line=lineno, doc_id=fields[2]) from None
            out.append(ir_measures.ScoredDoc(fields[0], fields[2], score))
    return out


def per_query(run_path: Path | dict, qrels: dict[str, dict[str, int]],
              measures: Sequence | None = None) -> dict[str, dict[str, float]]:
    """Each measure's value for every judged query: ``{measure name: {query id: value}}`` of a
    TREC run file or a run (qid -> [(doc id, score)]); a
    judged query without hits counts as zero (whether ir-measures reports a query absent
    from the run, as 0, or leaves it out depends on the measure's provider)."""
    measures = list(measures or MEASURES)
    if isinstance(run_path, dict):  # qid -> [(doc id, score)], as ``run_queries`` returns
        run = [ir_measures.ScoredDoc(q, d, s) for q, hits in run_path.items() if q in qrels
               for d, s in hits]
    else:
        run = [r for r in read_run(run_path) if r.query_id in qrels]
    out = {str(m): {q: 0.0 for q in qrels} for m in measures}
    for m in ir_measures.iter_calc(measures, qrels, run):
        out[str(m.measure)][m.query_id] = float(m.value)
    return {measure_name(m): out[str(m)] for m in measures}


def evaluate_run(run_path: Path, qrels: dict[str, dict[str, int]],
                 measures: Sequence | None = None) -> dict[str, float]:
    """Mean measures of a TREC run file over the judged queries (``per_query``)."""
    return means(per_query(run_path, qrels, measures))


def means(values: dict[str, dict[str, float]]) -> dict[str, float]:
    return {name: (sum(v.values()) / len(v) if v else 0.0) for name, v in values.items()}


def summarize(values: dict[str, dict[str, dict[str, float]]], confidence: float = 0.95) -> dict:
    """The charts' data from per-profile per-query values (profile -> measure -> qid ->
    value): each measure's mean per profile with a Student-t confidence interval over the
    queries, and each profile's per-query wins, ties and losses against the first profile
    (the baseline)."""
    from scipy import stats

    profiles = list(values)
    if not profiles:
        raise InvalidArgument("no profile to summarize")
    measures = list(values[profiles[0]])
    queries = sorted(values[profiles[0]][measures[0]]) if measures else []
    out = {"profiles": profiles, "measures": measures, "queries": len(queries),
           "confidence": confidence, "baseline": profiles[0], "means": {}, "wins": {},
           "deltas": {}}
    n = len(queries)
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) if n > 1 else 0.0
    for p in profiles:
        out["means"][p] = {}
        for m in measures:
            v = [values[p][m].get(q, 0.0) for q in queries]
            mean = sum(v) / n if n else 0.0
            sd = (sum((x - mean) ** 2 for x in v) / (n - 1)) ** 0.5 if n > 1 else 0.0
            half = t * sd / n ** 0.5 if n > 1 else 0.0
            out["means"][p][m] = {"mean": mean, "low": mean - half, "high": mean + half}
    base = values[profiles[0]]
    for p in profiles[1:]:
        out["wins"][p] = {}
        for m in measures:
            diffs = [values[p][m].get(q, 0.0) - base[m].get(q, 0.0) for q in queries]
            out["wins"][p][m] = {"wins": sum(d > 1e-12 for d in diffs),
                                 "ties": sum(abs(d) <= 1e-12 for d in diffs),
                                 "losses": sum(d < -1e-12 for d in diffs)}
            if m == measures[0]:  # the per-query chart: the first measure, largest gain first
                out["deltas"][p] = sorted(({"query": q, "delta": d} for q, d in
                                           zip(queries, diffs)), key=lambda x: -x["delta"])
    return out
