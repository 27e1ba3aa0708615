"""What the web console adds to a query: ``GET /api/search`` (HTTP, the console's client
call, JSON) against the same ``Client.query`` (explain, text and metadata) made directly,
interleaved rounds in one process over the shipped Cranfield (lexical, no model).

    python bench/bench_console.py [--docs 1400] [--queries 100] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import polyindex
from polyindex.client.remote import Client
from polyindex.console.serve import start_console
from polyindex.service.server import serve

CRANFIELD = Path(polyindex.__file__).parent / "cli" / "demo_data" / "cranfield"
TOKEN = "bench"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1400)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    recs = [json.loads(line) for line in (CRANFIELD / "corpus.jsonl").open()][:args.docs]
    queries = [json.loads(line)["text"] for line in
               (CRANFIELD / "queries.jsonl").open()][:args.queries]
    with tempfile.TemporaryDirectory(prefix="polyindex-bench-console-") as tmp:
        data = Path(tmp) / "data"
        eng = polyindex.open(data)
        eng.create_collection("cran", ["lexical"], model=None).add(
            [{"id": r["_id"], "title": r.get("title", ""), "text": r["text"]} for r in recs])
        eng.close()
        srv = serve(data, port=0, token=TOKEN)
        con = start_console(srv.address, TOKEN, root=data)
        client = Client(srv.address, token=TOKEN)
        coll = client.collection("cran")
        auth = {"Authorization": f"Bearer {TOKEN}"}

        def direct(q):
            coll.query(q, k=10, profile="lexical", explain=True, with_text=True,
                       with_metadata=True)

        def console(q):
            url = con.url + "api/search?" + urllib.parse.urlencode(
                {"collection": "cran", "q": q, "profile": "lexical", "k": 10})
            with urllib.request.urlopen(urllib.request.Request(url, headers=auth)) as r:
                json.loads(r.read())
        for q in queries[:10]:  # warm: numba, connections
            direct(q)
            console(q)
        times = {"client": [], "console": []}
        for _ in range(args.rounds):
            for name, fn in (("client", direct), ("console", console)):
                t0 = time.perf_counter()
                for q in queries:
                    fn(q)
                times[name].append(1000 * (time.perf_counter() - t0) / len(queries))
        con.stop()
        client.close()
        srv.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"docs": len(recs), "queries": len(queries), "rounds": args.rounds,
              "ms_per_query": med, "ratio_console_to_client": med["console"] / med["client"],
              "frontend": srv.frontend}
    print(f"{'path':<10} {'ms/query (median of rounds)':>28}")
    for k, v in med.items():
        print(f"{k:<10} {v:>28.2f}")
    print(f"console / client: {result['ratio_console_to_client']:.2f}x "
          f"({len(recs)} docs, {len(queries)} queries, {args.rounds} interleaved rounds, "
          f"{srv.frontend} front end)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "console.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
