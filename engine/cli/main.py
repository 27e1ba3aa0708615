"""The ``polyindex`` command line: index, query, eval, train-ranker, tune-bm25, serve, info, verify,
compact, demo, count, delete, scroll, export, snapshot (``cli.snapshot``), adapt (``cli.adapt_cmd``).

People read tables; programs read JSON (``--json``). Errors print one clear line on stderr and
exit non-zero (``exit_codes``: 2 for a user error, 1 otherwise).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from polyindex.cli import snapshot as snapshot_cli
from polyindex.cli.adapt_cmd import RecipeOpt as _adapt_recipe, parse_recipe, run as run_adapt
from polyindex.cli.disk_full import reported
from polyindex.cli.options import (PROFILES_HELP, CollOpt, DataOpt, DeviceOpt, JsonOpt,
                                   open_engine as _engine)
from polyindex.config import DEFAULT_INDEXES, check_declared
from polyindex.errors import InvalidArgument, PolyindexError

# rich_markup_mode=None: click's plain help, where a flag reads `--json`, not `--json <bool>`
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="polyindex: a retrieval engine with hybrid indexes.")
out = Console()
err = Console(stderr=True)
app.add_typer(snapshot_cli.app, name="snapshot")

def _version(value: bool) -> None:
    if value:
        from polyindex.cli.version import __version__
        print(f"polyindex {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """polyindex: a retrieval engine with hybrid indexes."""


@app.command()
def index(src: Path = typer.Argument(..., help="BEIR folder, .jsonl[.gz], .parquet, .arrow, .csv, or a vector file (.npy, .fvecs, .bvecs, ANN-benchmarks .hdf5)"),
          data: Path = DataOpt, collection: str = CollOpt,
          index: Optional[List[str]] = typer.Option(None, "--index", metavar="FACTORY", help="Factory string, repeatable (default: lexical + dense)."),
          field: Optional[List[str]] = typer.Option(None, "--field", metavar="NAME:TYPE", help="Filterable metadata field NAME:TYPE (string|int|float|bool), repeatable."),
          segment_size: int = typer.Option(50_000, "--segment-size", help="Documents per segment (new collections)."),
          ids: Optional[Path] = typer.Option(None, "--ids", metavar="FILE", help="Id file (one per line) of a vector file; default: row numbers."),
          model: Optional[str] = typer.Option(None, "--model", help="Text model of a new collection (default all-MiniLM-L6-v2); 'none': vectors-only, no encoder loaded."),
          dtype: Optional[str] = typer.Option(None, "--dtype", help="The model's precision for a new collection: auto (the default: bfloat16 on a GPU or a CPU with AVX-512 BF16/AMX, else float32, several times faster there; `info` says which), bfloat16, float32 or float16."),
          skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Skip and count bad records instead of stopping."),
          force: bool = typer.Option(False, "--force", help="Index a source again even if it was fully indexed."),
          prune_quality: Optional[str] = typer.Option(None, "--prune-quality", metavar="P", help="Keep the fraction P (0 <= P < 1) of documents with the lowest quality estimate out of the costly indexes (dense, multivector, sparse, tree): not encoded, not in those indexes, but stored, returned by get and found by lexical queries. The threshold (the P quantile of this input's quality) is stored in the collection and applied to later writes."),
          server: Optional[str] = typer.Option(None, "--server", help="Send the documents through the polyindex server at HOST:PORT (the directory's writer) instead of writing DATA."),
          ray: bool = typer.Option(False, "--ray", help="Encode and build segments on Ray (the extra polyindex[ray]): a local, loopback-only Ray unless --ray-address."),
          ray_address: Optional[str] = typer.Option(None, "--ray-address", metavar="ADDR", help="Join the Ray cluster at ADDR (with --ray); the source and DATA must be on storage every node sees."),
          encoders: int = typer.Option(1, "--encoders", help="Encoder actors (with --ray), each loading the model once."),
          gpus_per_encoder: float = typer.Option(0, "--gpus-per-encoder", help="GPUs per encoder actor (with --ray); 0: encode on CPUs."),
          as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
          progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress (phases, docs/s, ETA) on stderr."),
          adapt: bool = typer.Option(False, "--adapt", help="A new collection: once indexed, learn an encoder from it and re-encode it (polyindex adapt)."),
          recipe: Optional[List[str]] = _adapt_recipe,
          device: str = DeviceOpt):
    """Bulk-index documents into a collection; resumable.

    The collection is created on first use (with --index and --field); a rerun resumes
    after the last committed segment."""
    from polyindex.cuda.device import check_device
    check_device(device)  # before reading anything: a missing GPU is the first error
    if device != "cpu" and (ray or server is not None):
        raise InvalidArgument("--device cuda encodes in this process: not with --server, and "
                              "with --ray give the encoders GPUs (--gpus-per-encoder)")
    from polyindex.ingest.sources import open_source
    prune = None
    if prune_quality is not None:  # checked before anything is created
        from polyindex.rerank.doc_quality import check_fraction
        prune = check_fraction(prune_quality)
        if ray or server is not None:
            raise InvalidArgument("--prune-quality is a local bulk ingest's option: not with "
                                  "--ray or --server")
    if ray_address is not None or encoders != 1 or gpus_per_encoder:
        if not ray:
            raise InvalidArgument("--ray-address, --encoders and --gpus-per-encoder go with --ray")
    if ray:
        if server is not None:
            raise InvalidArgument("--ray writes DATA itself; it does not go with --server")
        from polyindex.distributed.cluster import require_ray
        require_ray()  # before anything is created: without Ray, the line that says how to get it
    if adapt and (ray or server is not None):
        raise InvalidArgument("--adapt adapts the collection this command writes: not with "
                              "--server or --ray (run polyindex adapt after)")
    parsed_recipe = parse_recipe(recipe) if adapt else None
    source = open_source(src, ids=ids)
    if server is not None:
        from polyindex.cli.remote_index import index_via_server
        fields = dict(_parse_field(f) for f in field or [])
        report, count = index_via_server(server, collection, source, indexes=index,
                                         fields=fields, skip_invalid=skip_invalid,
                                         progress=progress,
                                         create=_create_options(model, dtype, segment_size))
        payload = {**report.to_json(), "collection": collection, "documents": count}
        if as_json:
            print(json.dumps(payload))
        else:
            out.print(f"sent {report.indexed:,} documents to {server} ({report.batches} "
                      f"acknowledged batch(es), {report.skipped_invalid} invalid skipped); "
                      f"collection {collection!r} now has {count:,} documents")
        return
    eng = _engine(data, device=device)
    created = collection not in eng.list_collections()
    if not created:
        coll = eng.collection(collection)
        if dtype not in (None, "auto") and dtype != coll.config.dtype:
            raise InvalidArgument(f"collection {collection!r} exists with dtype "
                                  f"{coll.config.dtype}; --dtype gave {dtype}")
        if index and sorted(_describe(f) for f in index) != sorted(coll.config.indexes):
            raise InvalidArgument(f"collection {collection!r} exists with indexes "
                                  f"{coll.config.indexes}; --index gave {index}")
        check_declared(collection, coll.config.fields,
                       dict(_parse_field(f) for f in field or []), "--field")
        from polyindex.cli.file_metric import check_existing
        check_existing(src, coll, _say)
    else:
        from polyindex.cli.file_metric import indexes_for_new
        fields = dict(_parse_field(f) for f in field or [])
        indexes = indexes_for_new(src, index or list(DEFAULT_INDEXES), _say)
        coll = eng.create_collection(collection, indexes, fields=fields,
                                     **_create_options(model, dtype, segment_size))
    try:
        if adapt:  # refused before any work: adapt's own checks
            if not created:
                raise InvalidArgument(f"--adapt is for a new collection; {collection!r} "
                                      "exists: run polyindex adapt")
            from polyindex.adapt.run import check_adaptable
            check_adaptable(coll)
        if ray:
            from polyindex.distributed.ingest import ray_index
            report = ray_index(coll, source, encoders=encoders, gpus_per_encoder=gpus_per_encoder,
                               address=ray_address, skip_invalid=skip_invalid, force=force,
                               progress=progress)
        else:
            with reported(f"indexing {src} into {collection!r}",
                          "every segment committed before stays, and the same command "
                          "resumes after them once space is free"):
                report = coll.index(source, skip_invalid=skip_invalid, progress=progress,
                                    force=force, prune_quality=prune)
    except BaseException:
        # A first run that committed nothing leaves no empty collection behind.
        if created and not coll.table.sealed_snapshot().manifest.segments:
            eng.drop_collection(collection)
        raise
    adapted = run_adapt(coll, revert=False, device=device, recipe=parsed_recipe,
                        as_json=False, show_progress=progress, say=_say) if adapt else None
    payload = {**report.to_json(), "collection": collection, "documents": coll.count(),
               **({"adapt": adapted} if adapt else {})}
    if as_json:
        print(json.dumps(payload, default=str))
    elif report.already_indexed:
        out.print(f"{src} is already fully indexed in {collection!r} (use --force to index it again)")
    else:
        out.print(f"indexed {report.indexed:,} documents into {collection!r} "
                  f"({report.segments} segment(s), {report.skipped_invalid} invalid skipped); "
                  f"collection now has {payload['documents']:,} documents")


def _say(line: str) -> None:
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def _create_options(model: str | None, dtype: str | None, segment_size: int) -> dict:
    """A new collection's --model ('none': no model), --dtype and --segment-size, for the
    local engine and a server alike."""
    kw: dict = {"segment_size": segment_size}
    if model is not None:
        kw["model"] = None if model.lower() == "none" else model
    if dtype is not None:
        kw["dtype"] = dtype
    return kw


def _describe(factory: str) -> str:
    from polyindex.index.registry import from_factory
    return from_factory(factory).describe()


def _parse_field(spec: str) -> tuple[str, str]:
    name, sep, ftype = spec.partition(":")
    if not sep:
        raise InvalidArgument(f"--field {spec!r}: expected NAME:TYPE")
    return name, ftype


@app.command()
def query(text: Optional[str] = typer.Argument(None, help="Query text (or use --queries)."),
          data: Path = DataOpt, collection: str = CollOpt,
          profile: Optional[str] = typer.Option(None, "--profile", "-p", help=PROFILES_HELP),
          k: int = typer.Option(10, "--k", help="Number of hits (1..10000)."),
          filter: Optional[str] = typer.Option(None, "--filter", help='JSON filter on declared fields, e.g. \'{"year": {"gte": 1990}}\''),
          explain: bool = typer.Option(False, "--explain", help="Show each hit's per-stage ranks and scores."),
          with_text: bool = typer.Option(False, "--with-text", help="Include each hit's text (JSON output)."),
          with_metadata: bool = typer.Option(False, "--with-metadata", help="Include each hit's stored metadata."),
          queries: Optional[Path] = typer.Option(None, "--queries", help="Queries for a batch run: BEIR queries.jsonl, TSV (id<TAB>text) or TREC topics."),
          run: Optional[Path] = typer.Option(None, "--run", help="Write a TREC run file (with --queries)."),
          vector: Optional[str] = typer.Option(None, "--vector", metavar="JSON", help="Query vector as JSON: [..] (the unnamed field, or --using's) or {\"FIELD\": [..], ...}."),
          using: Optional[str] = typer.Option(None, "--using", metavar="FIELD", help="The vector field --vector is for."),
          as_json: bool = JsonOpt):
    """Query a collection (one text, or a batch of queries).

    One text prints a table (or --json); --queries FILE writes a TREC run to --run."""
    if queries is not None and run is None:
        raise InvalidArgument("--queries needs --run OUT.trec")
    if queries is None and not text and vector is None:
        raise InvalidArgument("give a query text, --vector or --queries FILE")
    coll = _engine(data, readonly=True).collection(collection)
    flt = _parse_filter(filter)
    if queries is not None:
        from polyindex.cli.evaluate import run_queries, write_trec
        from polyindex.ingest.sources import read_queries
        qs = read_queries(queries)
        result = run_queries(coll, qs, profile=profile, k=k, progress=not as_json)
        tag = profile or "default"
        write_trec(run, result, tag)
        lines = sum(len(v) for v in result.values())
        if as_json:
            print(json.dumps({"run": str(run), "queries": len(qs), "lines": lines}))
        else:
            out.print(f"wrote {lines:,} lines for {len(qs)} queries to {run}")
        return
    vec = None
    if vector is not None:
        try:
            vec = json.loads(vector)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"--vector is not valid JSON: {e}") from None
    # The embedded query's with_text brings title, text and metadata; print what was asked
    hits = coll.query(text or None, vector=vec, using=using, k=k, profile=profile, filter=flt,
                      explain=explain, with_text=True)
    if as_json:
        from polyindex.cli.show import hit_json
        print(json.dumps([hit_json(h, with_text, with_metadata, explain) for h in hits]))
        return
    from polyindex.cli.show import profile_ran
    shown = repr(text) if text else "vector"
    table = Table(title=f"{collection} · {profile_ran(coll, profile, text, vec, using)} · {shown}",
                  show_lines=False)
    for col in ("rank", "id", "score", "title / text", *(["metadata"] if with_metadata else [])):
        table.add_column(col, overflow="fold" if col in ("title / text", "metadata") else None)
    for h in hits:
        snippet = (h.text or "") if with_text else (h.title or h.text or "")[:90]
        meta = [json.dumps(h.metadata or {}, ensure_ascii=False)] if with_metadata else []
        table.add_row(str(h.rank), h.id, f"{h.score:.4f}", snippet, *meta)
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


@app.command("train-ranker")
def train_ranker(data: Path = DataOpt,
                 collection: List[str] = typer.Option(..., "--collection", "-c", metavar="NAME", help="Collection to train on (repeatable: one model over several, stored in each)."),
                 queries: List[Path] = typer.Option(..., "--queries", metavar="FILE", help="Queries (BEIR queries.jsonl, TSV or TREC topics), one per --collection."),
                 qrels: List[Path] = typer.Option(..., "--qrels", metavar="FILE", help="Training qrels, one per --collection."),
                 valid: Optional[List[Path]] = typer.Option(None, "--valid", metavar="FILE", help="Validation qrels for early stopping, one per --collection (default: 20% of the training queries)."),
                 name: str = typer.Option("ltr-trained", "--name", help="Ranker (and rank profile) name."),
                 window: int = typer.Option(100, "--window", help="Candidates reranked per query."),
                 profile: str = typer.Option("hybrid", "--profile", help="Profile giving the candidates (one without a rerank stage, e.g. hybrid)."),
                 transform: str = typer.Option("raw+query", "--transform", help="raw, raw+query (default: raw and per-query normalized scores) or general (ranks within the window, transfers across collections)."),
                 log_features: Optional[Path] = typer.Option(None, "--log-features", help="Write the training features to this .parquet file."),
                 as_json: bool = JsonOpt):
    """Train a LightGBM ranker on judged queries.

    The lambdarank model is stored in the collection with a rank profile of its --name."""
    from polyindex.cli.train_ranker import train_command
    report = train_command(_engine(data, create=False), collection, queries, qrels, valid, name=name,
                           window=window, profile=profile, transform=transform,
                           log_features=log_features, progress=not as_json)
    if as_json:
        print(json.dumps(report))
        return
    ndcg = report["valid_ndcg10"]
    out.print(f"trained ranker {name!r}: {report['rounds']} rounds on {report['train_queries']} "
              f"queries (validation nDCG@10 {'-' if ndcg is None else f'{ndcg:.4f}'} on "
              f"{report['valid_queries']} queries); stored in "
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
def info(data: Optional[Path] = typer.Option(None, "--data", help="Data directory."),
         settings: bool = typer.Option(False, "--settings", help="Show the process settings (POLYINDEX_* environment variables): value, default, what each does."),
         collection: Optional[str] = typer.Option(None, "--collection", "-c", help="Describe this collection (default: list them)."),
         server: Optional[str] = typer.Option(None, "--server", help="Describe the server at HOST:PORT instead: its processes (pid, role, requests) and collections."),
         token_file: Optional[Path] = typer.Option(None, "--token-file", help="With --server: file holding the bearer token."),
         as_json: bool = JsonOpt):
    """Describe a collection, or list the collections (or a running server's processes)."""
    from polyindex.cli.show import show_collection, show_collections, show_server, show_settings
    if settings:
        from polyindex.config import settings as current
        table = current().table()
        if as_json:
            print(json.dumps(table))
        else:
            show_settings(out, table)
        return
    if server is not None:
        from polyindex.client.remote import Client
        token = token_file.read_text().strip() if token_file else None
        with Client(server, token=token) as client:
            stats = client.stats(processes=True)
        if as_json:
            print(json.dumps(stats))
        else:
            show_server(out, server, stats)
        return
    if data is None:
        raise InvalidArgument("give --data DIR (or --server HOST:PORT)")
    eng = _engine(data, readonly=True)
    payload = (eng.collection(collection).info() if collection
               else {"collections": eng.list_collections()})
    if as_json:
        print(json.dumps(payload))
    elif collection:
        show_collection(out, payload)
    else:
        show_collections(out, data, [eng.collection(n).info() for n in payload["collections"]])


@app.command()
def verify(data: Path = DataOpt,
           collection: Optional[str] = typer.Option(None, "--collection", "-c", help="Check only this collection."),
           as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")):
    """Check every stored file in full (sizes, checksums, Arrow validation, write-ahead-log records); list every damaged one and exit 1 if any."""
    from polyindex.online.wal_check import check_wal
    from polyindex.storage.verify import verify_data
    reports = verify_data(data, collection, wal=check_wal)
    ok = all(r.ok for r in reports)
    if as_json:
        print(json.dumps({"ok": ok, "collections": [r.to_json() for r in reports]}))
    else:
        _print_verify(reports, ok)
    if not ok:
        raise typer.Exit(1)


def _print_verify(reports, ok: bool) -> None:
    # One line per file, never folded: paths stay whole and can be copied.
    for r in reports:
        notes = [f"{r.checked} files, {r.bytes / 1e6:.1f} MB checked"]
        if r.unchecked:
            notes.append(f"{len(r.unchecked)} format-1 file(s) without a checksum")
        if r.wal:
            notes.append(f"{len(r.wal)} WAL file(s), {sum(w['size'] for w in r.wal):,} bytes" +
                         ("" if r.wal_checked else ", not checked"))
        state = "ok" if r.ok else f"{len(r.problems)} damaged file(s)"
        out.print(f"{r.name}: {state} ({'; '.join(notes)})", highlight=False, markup=False,
                  soft_wrap=True, style=None if r.ok else "red")
        for w in r.wal:
            if w.get("torn_tail_at") is not None:  # a crash mid-append: not damage
                out.print(f"  {w['file']}: torn tail at byte {w['torn_tail_at']} of {w['size']} "
                          "(an append a crash interrupted, never acknowledged; not corruption: "
                          "the writer cuts it when it opens the collection)", highlight=False,
                          markup=False, soft_wrap=True)
        for p in r.problems:
            out.print(f"  {p['file']}: {p['problem']}", highlight=False, markup=False,
                      soft_wrap=True)
    if not reports:
        out.print("no collections found")
    elif ok:
        out.print(f"all {len(reports)} collection(s) intact")


@app.command()
def compact(data: Path = DataOpt, collection: str = CollOpt,
            max_segments: Optional[int] = typer.Option(None, "--max-segments", min=1, help="Merge until at most this many segments remain, no merge past POLYINDEX_MERGE_MAX_ROWS rows (default: one segment per size tier)."),
            as_json: bool = JsonOpt):
    """Merge segments and reclaim deleted rows and unreferenced files.

    Needs the data directory's writer lock: stop a server first, or let its background
    merging do the work."""
    from polyindex.cli.show import show_compaction
    eng = _engine(data, create=False)
    coll = eng.collection(collection)

    def step(r):
        if not as_json:
            out.print(f"merged {len(r['sources'])} segment(s) -> {r['segment'] or '(none)'}: "
                      f"{r['rows']:,} rows kept, {r['rows_dropped']:,} deleted rows dropped, "
                      f"{r['seconds']:.1f} s", highlight=False)
    with reported(f"compacting {collection!r}",
                  "merges finished before stay and the collection is otherwise unchanged; "
                  "free space and run compact again"):
        report = coll.compact(max_segments=max_segments, on_merge=step)
    eng.close()
    if as_json:
        print(json.dumps(report))
    else:
        show_compaction(out, report)


@app.command()
def demo(data: Path = typer.Option(Path(".demo"), "--data", help="Where the demo collection goes."),
         k: int = typer.Option(5, "--k", help="Hits shown per query and profile.")):
    """Index the shipped Cranfield data and query it.

    Shows a few queries under each profile and scores all judged queries."""
    from polyindex.cli.demo import run_demo
    run_demo(data, k, out)


# commands in their own modules, registered here
from polyindex.cli import data_ops as _data_ops, eval_cmd as _eval, export as _export  # noqa: E402
from polyindex.cli import adapt_cmd as _adapt, serve_cmd as _serve  # noqa: E402

app.command("eval")(_eval.eval_cmd)
app.command()(_serve.serve)
app.command("adapt")(_adapt.adapt)

app.command("count")(_data_ops.count)
app.command("delete")(_data_ops.delete)
app.command("scroll")(_data_ops.scroll)
app.command("export")(_export.export)


def main() -> None:
    try:
        from polyindex.config import settings
        settings()  # a bad POLYINDEX_* value is an error before any command starts
        # a full disk anywhere else: the same one line
        with reported(" ".join(sys.argv[1:2]) or "polyindex", "what was committed before stays"):
            app()
    except PolyindexError as e:
        # soft_wrap: one line, never folded at the console width (paths and ids stay whole)
        err.print(f"error ({e.status}): {e}", style="red", highlight=False, markup=False,
                  soft_wrap=True)
        from polyindex.cli.exit_codes import exit_code
        sys.exit(exit_code(e))


if __name__ == "__main__":
    main()
