"""``polyindex eval``: profiles of a collection, or TREC run files, scored with ir-measures;
with two or more, latency and paired t-tests against the first; ``--plot`` draws the
console's charts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from polyindex.cli.options import PROFILES_HELP, JsonOpt, open_engine
from polyindex.errors import InvalidArgument

out = Console()


def eval_cmd(qrels: Path = typer.Option(..., "--qrels", help="Judgements: BEIR qrels TSV or TREC qrels."),
             data: Optional[Path] = typer.Option(None, "--data", help="Data directory (to run queries; not with --run)."),
             collection: Optional[str] = typer.Option(None, "--collection", "-c", help="Collection to query (not with --run)."),
             queries: Optional[Path] = typer.Option(None, "--queries", help="Queries: BEIR queries.jsonl, TSV (id<TAB>text) or TREC topics."),
             profile: List[str] = typer.Option(["hybrid"], "--profile", "-p", metavar="PROFILE", help="Repeatable; 'all' = every built-in profile of the collection. " + PROFILES_HELP),
             run: Optional[List[Path]] = typer.Option(None, "--run", metavar="FILE", help="Score this existing TREC run file instead of querying (repeatable)."),
             measure: Optional[List[str]] = typer.Option(None, "--measure", "-m", metavar="MEASURE", help="An ir-measures measure, repeatable (e.g. nDCG@10, P@5, R@1000, RR, Judged@10). Default: nDCG@10, R@100, MRR@10, MAP."),
             k: int = typer.Option(1000, "--k", help="Hits per query in the run."),
             run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Keep the TREC runs here."),
             plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="Also draw the console's evaluation charts (each measure per profile with 95% confidence intervals, per-query wins and losses against the first profile): FILE.html (self-contained) or FILE.png (needs polyindex[plot], matplotlib)."),
             as_json: bool = JsonOpt):
    """Score profiles, or existing run files, with ir-measures.

    Either run the judged queries through each --profile of a collection, or score the
    TREC run files given with --run."""
    import tempfile

    import time

    from polyindex.cli.compare import paired_tests, render
    from polyindex.cli.evaluate import (means, parse_measures, per_query, run_queries, summarize,
                                         write_trec)
    from polyindex.cli.profile_names import expand
    from polyindex.ingest.sources import read_qrels, read_queries
    measures = parse_measures(measure)
    if plot is not None:
        from polyindex.console.plot import check_target
        check_target(plot)  # before any query runs
    qrel = read_qrels(qrels)
    values, latency, inside = {}, {}, {}
    if run:
        if data is not None or collection is not None or queries is not None:
            raise InvalidArgument("--run scores existing run files; --data, --collection and "
                                  "--queries are for running queries: give one or the other")
        for path in run:
            values[str(path)] = per_query(path, qrel, measures)
        title = f"{qrels}: {len(qrel)} judged queries"
    else:
        missing = [o for o, v in (("--data", data), ("--collection", collection),
                                  ("--queries", queries)) if v is None]
        if missing:
            raise InvalidArgument(f"give {', '.join(missing)} (to run queries) or --run FILE "
                                  "(to score a run)")
        coll = open_engine(data, readonly=True).collection(collection)
        profile = expand(profile, coll)
        from polyindex.cli.in_sample import in_sample
        inside = in_sample(coll, profile)
        qs = [(qid, t) for qid, t in read_queries(queries) if qid in qrel]
        if not qs:
            raise InvalidArgument(f"no query in {queries} has judgements in {qrels}")
        with tempfile.TemporaryDirectory() as tmp:
            folder = run_dir or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            for p in profile:
                start = time.perf_counter()
                result = run_queries(coll, qs, profile=p, k=k, progress=not as_json)
                latency[p] = (time.perf_counter() - start) * 1000 / len(qs)
                path = folder / f"{collection}.{p}.trec"
                write_trec(path, result, p)
                values[p] = per_query(path, qrel, measures)
        title = f"{collection}: {len(qs)} judged queries"
    results = {entry: means(v) for entry, v in values.items()}
    tests = paired_tests(values)  # two or more: each against the first
    if plot is not None:
        from polyindex.console.plot import write_plot
        write_plot(plot, summarize(values), title)
    if as_json:
        payload = ({"runs": len(run), "queries": len(qrel)} if run else
                   {"collection": collection, "queries": len(qs), "latency_ms": latency})
        print(json.dumps({**payload, "results": results,
                          **({"baseline": next(iter(results)), "paired_t_test": tests}
                             if tests else {}), **({"in_sample": inside} if inside else {}),
                          **({"plot": str(plot)} if plot else {})}))
        return
    render(out, title, "run" if run else "profile", results, latency, tests, inside)
    if plot is not None:
        out.print(f"wrote the charts to {plot}")
