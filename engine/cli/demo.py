"""``polyindex demo``: index the Cranfield collection shipped in the package and query it."""
from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from polyindex.config import DEFAULT_INDEXES
from polyindex.query.profiles import DEFAULT

DEMO_DATA = Path(__file__).parent / "demo_data" / "cranfield"
QUERIES = ["what similarity laws must be obeyed when constructing aeroelastic models of heated "
           "high speed aircraft", "boundary layer transition at hypersonic speeds",
           "heat transfer to a blunt body in supersonic flow"]
PROFILES = ("lexical", "dense", "hybrid", DEFAULT)  # the default last: it is what a query gets


def run_demo(data: Path, k: int, out: Console) -> None:
    from polyindex.cli.evaluate import evaluate_run, run_queries, write_trec
    from polyindex.engine import Engine
    from polyindex.ingest.sources import read_qrels, read_queries
    eng = Engine(data)
    coll = eng.create_collection("cranfield", list(DEFAULT_INDEXES), exist_ok=True)
    report = coll.index(DEMO_DATA, progress=True)
    out.print(f"[bold]cranfield[/bold]: {coll.count():,} documents "
              f"({'already indexed' if report.already_indexed else f'{report.indexed:,} indexed'}) "
              f"in {data}")
    for text in QUERIES:
        table = Table(title=f"{text!r}", title_justify="left")
        table.add_column("profile", no_wrap=True, min_width=7)
        table.add_column("rank", justify="right", no_wrap=True, min_width=4)
        table.add_column("id", justify="right", no_wrap=True, min_width=5)
        table.add_column("score", justify="right", no_wrap=True, min_width=7)
        table.add_column("title", overflow="ellipsis", no_wrap=True, max_width=44)
        for profile in PROFILES:
            for h in coll.query(text, k=k, profile=profile, with_text=True):
                table.add_row(profile if h.rank == 1 else "", str(h.rank), h.id,
                              f"{h.score:.4f}", h.title or (h.text or "")[:70])
            table.add_section()
        out.print(table)
    qrels = read_qrels(DEMO_DATA / "qrels" / "test.tsv")
    queries = [q for q in read_queries(DEMO_DATA / "queries.jsonl") if q[0] in qrels]
    table = Table(title=f"cranfield, all {len(queries)} judged queries (ir-measures)")
    table.add_column("profile")
    with tempfile.TemporaryDirectory() as tmp:
        for i, profile in enumerate(PROFILES):
            path = Path(tmp) / f"{profile}.trec"
            write_trec(path, run_queries(coll, queries, profile=profile, k=1000), profile)
            scores = evaluate_run(path, qrels)
            if i == 0:
                for name in scores:
                    table.add_column(name, justify="right")
            table.add_row(profile, *(f"{v:.4f}" for v in scores.values()))
    out.print(table)
