"""The ``polyindex`` command line: index, query, eval, train-ranker, tune-bm25, serve, info, demo.

People read tables; programs read JSON (``--json``). Errors print one clear line on stderr and
exit non-zero (2 for bad input, 1 otherwise).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from polyindex.errors import InvalidArgument, PolyindexError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="polyindex: a retrieval engine with hybrid indexes.")
out = Console()
err = Console(stderr=True)

DataOpt = typer.Option(..., "--data", help="Data directory holding the collections.")
CollOpt = typer.Option(..., "--collection", "-c", help="Collection name.")


def _engine(data: Path):
    from polyindex.engine import Engine
    return Engine(data)


@app.command()
def index(src: Path = typer.Argument(..., help="BEIR folder, .jsonl[.gz], .parquet or .csv"),
          data: Path = DataOpt, collection: str = CollOpt,
          index: Optional[List[str]] = typer.Option(None, "--index", help="Factory string, repeatable (default: lexical + dense)."),
          field: Optional[List[str]] = typer.Option(None, "--field", help="Filterable metadata field NAME:TYPE (string|int|float|bool), repeatable."),
          segment_size: int = typer.Option(50_000, help="Documents per segment (new collections)."),
          skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Skip and count bad records instead of stopping."),
          force: bool = typer.Option(False, "--force", help="Index a source again even if it was fully indexed."),
          as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
          progress: bool = typer.Option(True, "--progress/--no-progress")):
    """Bulk-index documents into a collection (created on first use); resumable."""
    from polyindex.ingest.sources import open_source
    eng = _engine(data)
    source = open_source(src)
    if collection in eng.list_collections():
        coll = eng.collection(collection)
        if index and sorted(_describe(f) for f in index) != sorted(coll.config.indexes):
            raise InvalidArgument(f"collection {collection!r} exists with indexes "
                                  f"{coll.config.indexes}; --index gave {index}")
    else:
        fields = dict(_parse_field(f) for f in field or [])
        coll = eng.create_collection(collection, index or ["lexical", "dense"],
                                     segment_size=segment_size, fields=fields)
    report = coll.index(source, skip_invalid=skip_invalid, progress=progress, force=force)
    payload = {**report.to_json(), "collection": collection, "documents": coll.count()}
    if as_json:
        print(json.dumps(payload))
    elif report.already_indexed:
        out.print(f"{src} is already fully indexed in {collection!r} (use --force to index it again)")
    else:
        out.print(f"indexed {report.indexed:,} documents into {collection!r} "
                  f"({report.segments} segment(s), {report.skipped_invalid} invalid skipped); "
                  f"collection now has {payload['documents']:,} documents")


def _describe(factory: str) -> str:
    from polyindex.index.protocol import from_factory
    return from_factory(factory).describe()


def _parse_field(spec: str) -> tuple[str, str]:
    name, sep, ftype = spec.partition(":")
    if not sep:
        raise InvalidArgument(f"--field {spec!r}: expected NAME:TYPE")
    return name, ftype


@app.command()
def query(text: Optional[str] = typer.Argument(None, help="Query text (or use --queries)."),
          data: Path = DataOpt, collection: str = CollOpt,
          profile: Optional[str] = typer.Option(None, "--profile", "-p"),
          k: int = typer.Option(10, "--k"),
          filter: Optional[str] = typer.Option(None, "--filter", help='JSON filter, e.g. \'{"year": {"gte": 1990}}\''),
          explain: bool = typer.Option(False, "--explain"),
          queries: Optional[Path] = typer.Option(None, "--queries", help="queries.jsonl for a batch run."),
          run: Optional[Path] = typer.Option(None, "--run", help="Write a TREC run file (with --queries)."),
          as_json: bool = typer.Option(False, "--json")):
    """Query a collection: one text (a table), or a batch of queries to a TREC run file."""
    coll = _engine(data).collection(collection)
    flt = _parse_filter(filter)
    if queries is not None:
        from polyindex.cli.evaluate import run_queries, write_trec
        from polyindex.ingest.sources import read_queries
        qs = read_queries(queries)
        result = run_queries(coll, qs, profile=profile, k=k, progress=True)
        if run is None:
            raise InvalidArgument("--queries needs --run OUT.trec")
        tag = profile or "default"
        write_trec(run, result, tag)
        out.print(f"wrote {sum(len(v) for v in result.values()):,} lines for {len(qs)} queries to {run}")
        return
    if not text:
        raise InvalidArgument("give a query text or --queries FILE")
    hits = coll.query(text, k=k, profile=profile, filter=flt, explain=explain, with_text=True)
    if as_json:
        print(json.dumps([{"rank": h.rank, "id": h.id, "score": h.score, "title": h.title,
                           **({"explain": h.explain} if explain else {})} for h in hits]))
        return
    table = Table(title=f"{collection} · {profile or 'default'} · {text!r}", show_lines=False)
    for col in ("rank", "id", "score", "title / text"):
        table.add_column(col, overflow="fold" if col == "title / text" else None)
    for h in hits:
        snippet = (h.title or h.text or "")[:90]
        table.add_row(str(h.rank), h.id, f"{h.score:.4f}", snippet)
    out.print(table)
    if explain:
        for h in hits:
            out.print(f"{h.rank:>3} {h.id}: {json.dumps(h.explain)}")


def _parse_filter(text: Optional[str]):
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"--filter is not valid JSON: {e}") from None


@app.command("eval")
def eval_cmd(data: Path = DataOpt, collection: str = CollOpt,
             queries: Path = typer.Option(..., "--queries"),
             qrels: Path = typer.Option(..., "--qrels"),
             profile: List[str] = typer.Option(["hybrid"], "--profile", "-p", help="Repeatable; 'all' = every built-in profile of the collection."),
             k: int = typer.Option(1000, "--k", help="Hits per query in the run."),
             run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Keep the TREC runs here."),
             as_json: bool = typer.Option(False, "--json")):
    """Evaluate profiles with ir-measures (nDCG@10, R@100, MRR@10, MAP) on judged queries."""
    import tempfile

    from polyindex.cli.evaluate import evaluate_run, run_queries, write_trec
    from polyindex.cli.profile_names import expand
    from polyindex.ingest.sources import read_qrels, read_queries
    coll = _engine(data).collection(collection)
    profile = expand(profile, coll)
    qrel = read_qrels(qrels)
    qs = [(qid, t) for qid, t in read_queries(queries) if qid in qrel]
    if not qs:
        raise InvalidArgument(f"no query in {queries} has judgements in {qrels}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = run_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for p in profile:
            run = run_queries(coll, qs, profile=p, k=k, progress=not as_json)
            path = folder / f"{collection}.{p}.trec"
            write_trec(path, run, p)
            results[p] = evaluate_run(path, qrel)
    payload = {"collection": collection, "queries": len(qs), "results": results}
    if as_json:
        print(json.dumps(payload))
        return
    table = Table(title=f"{collection}: {len(qs)} judged queries")
    table.add_column("profile")
    names = list(next(iter(results.values())))
    for n in names:
        table.add_column(n, justify="right")
    for p, r in results.items():
        table.add_row(p, *(f"{r[n]:.4f}" for n in names))
    out.print(table)


@app.command("train-ranker")
def train_ranker(data: Path = DataOpt,
                 collection: List[str] = typer.Option(..., "--collection", "-c", help="Collection to train on (repeatable: one model over several, stored in each)."),
                 queries: List[Path] = typer.Option(..., "--queries", help="queries.jsonl, one per --collection."),
                 qrels: List[Path] = typer.Option(..., "--qrels", help="Training qrels, one per --collection."),
                 valid: Optional[List[Path]] = typer.Option(None, "--valid", help="Validation qrels for early stopping, one per --collection (default: 20% of the training queries)."),
                 name: str = typer.Option("ltr-trained", "--name", help="Ranker (and rank profile) name."),
                 window: int = typer.Option(100, "--window", help="Candidates reranked per query."),
                 profile: str = typer.Option("hybrid", "--profile", help="Profile giving the candidates."),
                 transform: str = typer.Option("raw+query", "--transform", help="raw, raw+query (default: raw and per-query normalized scores) or general (ranks within the window, transfers across collections)."),
                 log_features: Optional[Path] = typer.Option(None, "--log-features", help="Write the training features to this .parquet file."),
                 as_json: bool = typer.Option(False, "--json")):
    """Train a LightGBM lambdarank ranker on judged queries; store it with a profile NAME."""
    from polyindex.cli.train_ranker import train_command
    report = train_command(_engine(data), collection, queries, qrels, valid, name=name,
                           window=window, profile=profile, transform=transform,
                           log_features=log_features, progress=not as_json)
    if as_json:
        print(json.dumps(report))
        return
    out.print(f"trained ranker {name!r}: {report['rounds']} rounds on {report['train_queries']} "
              f"queries (validation nDCG@10 {report['valid_ndcg10']}); stored in "
              f"{', '.join(report['collections'])} with rank profile {name!r}")


@app.command("tune-bm25")
def tune_bm25(data: Path = DataOpt, collection: str = CollOpt,
              queries: Path = typer.Option(..., "--queries", help="queries.jsonl (or a BEIR folder)."),
              qrels: Path = typer.Option(..., "--qrels", help="Training qrels."),
              test: Optional[Path] = typer.Option(None, "--test", help="Test qrels: score the tuned setting there instead of cross-validating."),
              folds: int = typer.Option(5, "--folds", help="Cross-validation folds by query (without --test)."),
              seed: int = typer.Option(0, "--seed", help="Shuffles the queries into folds."),
              measure: str = typer.Option("nDCG@10", "--measure", help="ir-measures measure to maximize."),
              variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated BM25 variants (default bm25,robertson,bm25l,bm25+)."),
              k1: Optional[str] = typer.Option(None, "--k1", help="Comma-separated k1 values (default 0.5,0.9,1.2,1.5,2.0)."),
              b: Optional[str] = typer.Option(None, "--b", help="Comma-separated b values (default 0.2,0.4,0.6,0.75,0.9,1.0)."),
              delta: Optional[str] = typer.Option(None, "--delta", help="Comma-separated delta values for bm25l/bm25+ (default 0.5,1.0)."),
              store: bool = typer.Option(True, "--store/--no-store", help="Store the best setting as the collection's lexical scorer."),
              as_json: bool = typer.Option(False, "--json")):
    """Grid-search the lexical BM25 variant, k1 and b on judged queries; store the best."""
    from polyindex.cli.tune import parse_grid, render, tune_command
    report = tune_command(_engine(data), collection, queries, qrels, test, folds=folds,
                          seed=seed, measure=measure, grid=parse_grid(variants, k1, b, delta),
                          store=store, progress=not as_json)
    if as_json:
        print(json.dumps(report))
    else:
        render(report, out)


@app.command()
def info(data: Path = DataOpt, collection: Optional[str] = typer.Option(None, "--collection", "-c"),
         as_json: bool = typer.Option(False, "--json")):
    """Describe a collection (or list the collections of a data directory)."""
    eng = _engine(data)
    payload = (eng.collection(collection).info() if collection
               else {"collections": eng.list_collections()})
    if as_json:
        print(json.dumps(payload))
    else:
        for key, value in payload.items():
            out.print(f"[bold]{key}[/bold]: {value}")


@app.command()
def demo(data: Path = typer.Option(Path(".demo"), "--data", help="Where the demo collection goes."),
         k: int = typer.Option(5, "--k")):
    """Index the shipped Cranfield collection and show a few queries under each profile."""
    from polyindex.cli.demo import run_demo
    run_demo(data, k, out)


@app.command()
def serve(data: Path = DataOpt,
          host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
          port: int = typer.Option(50051, "--port", help="Port; 0 picks a free one (the bound address is printed)."),
          token_file: Optional[Path] = typer.Option(None, "--token-file", help="File holding the bearer token every call must send."),
          tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="PEM certificate (with --tls-key)."),
          tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="PEM private key."),
          workers: int = typer.Option(8, "--workers", help="Threads serving calls concurrently."),
          metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus /metrics on 127.0.0.1:PORT."),
          cpus: Optional[str] = typer.Option(None, "--cpus", help="Pin the server to these CPUs (e.g. 1 or 0-3): fewer cross-core wake-ups per call, lower latency, less parallelism."),
          frontend: str = typer.Option("auto", "--frontend", help="native (gRPC C++, built by `make native`), python (grpcio) or auto (native when built).")):
    """Serve the collections over gRPC until SIGTERM/SIGINT, then drain calls and flush writes."""
    from polyindex.service.server import run
    run(data, host=host, port=port, token_file=token_file, tls_cert=tls_cert, tls_key=tls_key,
        workers=workers, metrics_port=metrics_port, cpus=cpus, frontend=frontend)


def main() -> None:
    try:
        app()
    except PolyindexError as e:
        # soft_wrap: one line, never folded at the console width (paths and ids stay whole)
        err.print(f"error ({e.status}): {e}", style="red", highlight=False, markup=False,
                  soft_wrap=True)
        sys.exit(2 if isinstance(e, InvalidArgument) else 1)


if __name__ == "__main__":
    main()
