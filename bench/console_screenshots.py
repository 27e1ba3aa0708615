"""Screenshots of every page of the web console (issue 44), for a person to look at.

Serves a data directory (default: the shipped Cranfield, 300 documents, lexical + dense,
indexed into a temporary folder) with a token, starts the console beside it, and has headless
Chromium (Debian's ``chromium``) save each page: collections, search (the ltr profile, every
hit's explain drawn), compare (lexical against hybrid) and evaluate (lexical, dense, hybrid,
ltr on the judged queries).

    python bench/console_screenshots.py [--data DIR --collection NAME --queries F --qrels F]
                                        [--out docs/notes/console]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the browser helper the tests use

from console_browser import CHROMIUM, MISSING, screenshot  # noqa: E402

import polyindex  # noqa: E402
from polyindex.console.serve import start_console  # noqa: E402
from polyindex.service.server import serve  # noqa: E402

CRANFIELD = Path(polyindex.__file__).parent / "cli" / "demo_data" / "cranfield"
QUERY = "what similarity laws must be obeyed when constructing aeroelastic models"
TOKEN = "screenshots"


def cranfield(data: Path, n: int) -> None:
    recs = [json.loads(line) for line in (CRANFIELD / "corpus.jsonl").open()][:n]
    eng = polyindex.open(data)
    eng.create_collection("cranfield", dtype="float32").add(
        [{"id": r["_id"], "title": r.get("title", ""), "text": r["text"]} for r in recs])
    eng.close()
    shutil.copy(CRANFIELD / "queries.jsonl", data / "queries.jsonl")
    shutil.copy(CRANFIELD / "qrels" / "test.tsv", data / "qrels.tsv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="A data directory to serve (default: Cranfield).")
    ap.add_argument("--collection", default="cranfield")
    ap.add_argument("--queries", default="queries.jsonl", help="Under --data.")
    ap.add_argument("--qrels", default="qrels.tsv", help="Under --data.")
    ap.add_argument("--query", default=QUERY)
    ap.add_argument("--docs", type=int, default=300, help="Cranfield documents (default data).")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "notes" / "console")
    args = ap.parse_args()
    if CHROMIUM is None:
        sys.exit(f"console_screenshots: {MISSING}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="polyindex-screens-") as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "data"
            t0 = time.perf_counter()
            cranfield(data, args.docs)
            print(f"indexed {args.docs} Cranfield documents in {time.perf_counter() - t0:.1f} s")
        srv = serve(data, port=0, token=TOKEN, frontend="auto")
        srv.models_ready.wait(600)
        con = start_console(srv.address, TOKEN, root=data, latency=srv.metrics.query_latency)
        c, q = args.collection, args.query
        pages = {
            "search": ("/search", [("collection", c), ("q", q), ("profile", "ltr")]),
            "compare": ("/compare", [("collection", c), ("q", q), ("a", "lexical"),
                                     ("b", "hybrid")]),
            "evaluate": ("/evaluate", [("collection", c), ("queries", args.queries),
                                       ("qrels", args.qrels), *[("profile", p) for p in
                                       ("lexical", "dense", "hybrid", "ltr")]]),
            "collections": ("/", []),  # last: its load chart shows the queries above
        }
        try:
            for name, (path, params) in pages.items():
                url = con.url.rstrip("/") + path + "?" + urllib.parse.urlencode(
                    [*params, ("token", TOKEN)])
                target = args.out / f"{name}.png"
                t0 = time.perf_counter()
                screenshot(url, target, size=(1400, 1100), budget_ms=60_000, timeout=600)
                print(f"{target} ({time.perf_counter() - t0:.1f} s)")
        finally:
            con.stop()
            srv.stop()


if __name__ == "__main__":
    main()
