"""What the console's pages ask for, as JSON, over the SDK's remote collection: a page shows
exactly what a client of the gRPC service gets."""
from __future__ import annotations

import json
import time

from polyindex.errors import InvalidArgument
from polyindex.types import MAX_K

MAX_EVAL_K = 1000
MAX_COMPARE_K = 100


def _int(params: dict, name: str, default: int, high: int) -> int:
    raw = _one(params, name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {raw!r}") from None
    if not 1 <= value <= high:
        raise InvalidArgument(f"{name} must be in 1..{high}, got {value}")
    return value


def _one(params: dict, name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values else None


def _need(params: dict, name: str) -> str:
    value = _one(params, name)
    if not value:
        raise InvalidArgument(f"give {name}=...")
    return value


def _filter(params: dict):
    raw = _one(params, "filter")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"filter is not valid JSON: {e}") from None


def hit_json(h) -> dict:
    return {"rank": h.rank, "id": h.id, "score": h.score, "title": h.title, "text": h.text,
            "metadata": h.metadata or {}, "explain": h.explain}


class Api:
    def __init__(self, client, files, sampler=None):
        self.client, self.files, self.sampler = client, files, sampler

    def overview(self, params: dict) -> dict:
        """The server's health and counts, and every collection's description."""
        stats = self.client.stats()
        out = {"health": self.client.health(), "uptime_s": stats["uptime_s"],
               "requests": stats["requests"], "requests_total": stats["requests_total"],
               "process": stats["process"], "collections": []}
        for name in sorted(stats["collections"]):
            info = self.client.collection(name).info()
            out["collections"].append({**info, **stats["collections"][name], "name": name})
        return out

    def metrics(self, params: dict) -> dict:
        return self.sampler.series() if self.sampler is not None else {"points": []}

    def search(self, params: dict) -> dict:
        coll = self.client.collection(_need(params, "collection"))
        q = _need(params, "q")
        profile = _one(params, "profile") or None
        k = _int(params, "k", 10, MAX_K)
        t0 = time.perf_counter()
        hits = coll.query(q, k=k, profile=profile, filter=_filter(params), explain=True,
                          with_text=True, with_metadata=True)
        return {"collection": coll.name, "q": q, "profile": profile, "k": k,
                "took_ms": 1000 * (time.perf_counter() - t0), "hits": [hit_json(h) for h in hits]}

    def compare(self, params: dict) -> dict:
        """Two profiles' hits for one query; ``moved``: each id's rank under a and b (None
        where a list lacks it) for the ids whose rank differs."""
        coll = self.client.collection(_need(params, "collection"))
        q = _need(params, "q")
        a, b = _need(params, "a"), _need(params, "b")
        k = _int(params, "k", 10, MAX_COMPARE_K)
        flt = _filter(params)
        lists = {}
        for side, profile in (("a", a), ("b", b)):
            hits = coll.query(q, k=k, profile=profile, filter=flt, with_text=True,
                              with_metadata=False)
            lists[side] = [hit_json(h) for h in hits]
        ra = {h["id"]: h["rank"] for h in lists["a"]}
        rb = {h["id"]: h["rank"] for h in lists["b"]}
        moved = {i: {"a": ra.get(i), "b": rb.get(i)} for i in {*ra, *rb}
                 if ra.get(i) != rb.get(i)}
        return {"collection": coll.name, "q": q, "k": k, "profiles": {"a": a, "b": b},
                "a": lists["a"], "b": lists["b"], "moved": moved}

    def file_list(self, params: dict) -> dict:
        return {"files": self.files.listing()}

    def evaluate(self, params: dict) -> dict:
        """Run the judged queries through each profile and summarize with ir-measures (the
        CLI's ``eval``, ``cli.evaluate``)."""
        from polyindex.cli.evaluate import parse_measures, per_query, run_queries, summarize
        from polyindex.ingest.sources import read_qrels, read_queries
        coll = self.client.collection(_need(params, "collection"))
        profiles = [p for p in params.get("profile", []) if p]
        if not profiles:
            raise InvalidArgument("give one or more profile=...")
        if len(set(profiles)) != len(profiles):
            raise InvalidArgument(f"a profile is named twice: {profiles}")
        measures = parse_measures([m for m in params.get("measure", []) if m])
        k = _int(params, "k", 100, MAX_EVAL_K)
        qrels = read_qrels(self.files.resolve(_need(params, "qrels"), "qrels"))
        queries = [(qid, t) for qid, t in read_queries(self.files.resolve(
            _need(params, "queries"), "queries")) if qid in qrels]
        if not queries:
            raise InvalidArgument("no query in the queries file has judgements in the qrels")
        t0 = time.perf_counter()
        # over every judged query, a query without hits counting 0: `polyindex eval`'s numbers
        values = {p: per_query(run_queries(coll, queries, profile=p, k=k), qrels, measures)
                  for p in profiles}
        return {**summarize(values), "collection": coll.name, "k": k,
                "seconds": time.perf_counter() - t0}
