"""``polyindex tune-bm25``: fit the lexical index's BM25 (variant, k1, b, delta) to a collection.

Every setting of a grid is run once over the judged training queries (lexical top 100 per
query, scored per query with ir-measures); picking the best setting is then only arithmetic
on those per-query values, so the cross-validation costs nothing extra:

- without ``--test``, the training queries are split into ``--folds`` folds (by query, shuffled
  with ``--seed``); each fold is scored with the setting that is best on the other folds, and
  the reported tuned score is the mean over these held-out values (never train-on-test);
- with ``--test QRELS``, the setting best on all training queries is scored on the test
  queries.

Either way the setting best on all training queries is what is stored (unless ``--no-store``)
as the collection's lexical scorer (``CollectionConfig.lexical_params``, one manifest commit);
every profile's lexical stage then uses it. Ties prefer the earlier setting of the grid, and
the grid starts with the collection's factory scorer, so a grid that cannot beat it keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import ir_measures
import numpy as np

from polyindex.errors import InvalidArgument
from polyindex.index.lexical.bm25 import WITH_DELTA, Scorer, canonical_variant
from polyindex.ingest.progress import progress_bar

VARIANTS = ("bm25", "robertson", "bm25l", "bm25+")  # lucene ranks exactly as bm25
K1 = (0.5, 0.9, 1.2, 1.5, 2.0)
B = (0.2, 0.4, 0.6, 0.75, 0.9, 1.0)
DELTA = (0.5, 1.0)
DEPTH = 100  # hits per query: enough for any cut-off measure people tune for
BATCH = 256


@dataclass
class Grid:
    variants: Sequence[str] = VARIANTS
    k1: Sequence[float] = K1
    b: Sequence[float] = B
    delta: Sequence[float] = DELTA

    def settings(self, first: Scorer) -> list[Scorer]:
        """Every setting, ``first`` (the factory scorer) first, no duplicates."""
        out = [first]
        for v in self.variants:
            for k1 in self.k1:
                for b in self.b:
                    for d in (self.delta if v in WITH_DELTA else (first.delta,)):
                        s = Scorer(v, float(k1), float(b), float(d))
                        if s not in out:
                            out.append(s)
        return out


def parse_grid(variants: str | None, k1: str | None, b: str | None, delta: str | None) -> Grid:
    def floats(text, default, name):
        if text is None:
            return default
        try:
            values = tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise InvalidArgument(f"--{name}: expected comma-separated numbers, got {text!r}") from None
        if not values:
            raise InvalidArgument(f"--{name}: no values")
        return values
    names = VARIANTS if variants is None else tuple(
        canonical_variant(v, "--variants") for v in variants.split(",") if v.strip())
    if not names:
        raise InvalidArgument("--variants: no values")
    return Grid(names, floats(k1, K1, "k1"), floats(b, B, "b"), floats(delta, DELTA, "delta"))


def per_query(coll, queries: list[tuple[str, str]], qrels: dict, scorer: Scorer,
              measure) -> dict[str, float]:
    """qid -> the measure of the lexical top ``DEPTH`` under ``scorer`` (0 without hits)."""
    params = f"variant={scorer.variant},k1={scorer.k1},b={scorer.b}"
    if scorer.variant in WITH_DELTA:
        params += f",delta={scorer.delta}"
    profile = {"retrieve": [{"index": "lexical", "k": DEPTH, "params": params}]}
    run: dict[str, dict[str, float]] = {}
    for start in range(0, len(queries), BATCH):
        chunk = queries[start:start + BATCH]
        for (qid, _), hits in zip(chunk, coll.query_batch([t for _, t in chunk], k=DEPTH,
                                                          profile=profile)):
            # rounded as a TREC run file has them, so ties break as in `polyindex eval`
            run[qid] = {h.id: round(h.score, 6) for h in hits}
    values = {qid: 0.0 for qid, _ in queries}
    for m in ir_measures.iter_calc([measure], qrels, run):
        values[m.query_id] = float(m.value)
    return values


def folds_of(qids: Sequence[str], n_folds: int, seed: int) -> list[list[str]]:
    order = np.random.default_rng(seed).permutation(len(qids))
    return [[qids[i] for i in part] for part in np.array_split(order, n_folds)]


def _best(table: np.ndarray, rows: np.ndarray) -> int:
    """The setting (column) with the best mean over ``rows``; ties: the earlier one."""
    return int(np.argmax(table[rows].mean(axis=0)))


def tune(coll, queries: list[tuple[str, str]], qrels: dict, *, test_qrels: dict | None = None,
         n_folds: int = 5, seed: int = 0, measure: str = "nDCG@10", grid: Grid | None = None,
         store: bool = True, progress: bool = False) -> dict:
    """Grid-search the lexical scorer; see the module docstring. Returns the report."""
    if "lexical" not in coll.kinds:
        raise InvalidArgument(f"collection {coll.name!r} has no lexical index to tune")
    from polyindex.cli.evaluate import parse_measures  # any case, "did you mean", TREC names
    found = parse_measures([measure])
    if len(found) != 1:
        raise InvalidArgument(f"--measure {measure!r} names {len(found)} measures; tune one")
    m = found[0]
    grid = grid or Grid()
    train = [(q, t) for q, t in queries if q in qrels]
    if not train:
        raise InvalidArgument("no query has training judgements")
    test = [(q, t) for q, t in queries if test_qrels is not None and q in test_qrels]
    if test_qrels is not None and not test:
        raise InvalidArgument("no query has test judgements")
    if test_qrels is None and not 2 <= n_folds <= len(train):
        raise InvalidArgument(f"--folds must be in 2..{len(train)} (the training queries)")
    factory = next(f for f in coll.config.indexes if f.partition(":")[0].strip() == "lexical")
    from polyindex.index.lexical.bm25 import parse_body
    default = parse_body(factory.partition(":")[2].strip(), "lexical factory")
    settings = grid.settings(default)
    qids = [q for q, _ in train]
    table = np.zeros((len(qids), len(settings)))
    with progress_bar(f"tune-bm25 {coll.name}", len(settings), "settings",
                      enabled=progress) as advance:
        for j, s in enumerate(settings):
            values = per_query(coll, train, qrels, s, m)
            table[:, j] = [values[q] for q in qids]
            advance(1)
    best = _best(table, np.arange(len(qids)))
    report = {"collection": coll.name, "measure": str(m), "settings": len(settings),
              "train_queries": len(train),
              "default": {"params": default.describe(), "train": float(table[:, 0].mean())},
              "tuned": {"params": settings[best].describe(),
                        "train": float(table[:, best].mean())}}
    if test_qrels is None:
        index = {q: i for i, q in enumerate(qids)}
        held = np.zeros(len(qids))
        folds = []
        for part in folds_of(qids, n_folds, seed):
            out = np.array([index[q] for q in part])
            inside = np.setdiff1d(np.arange(len(qids)), out)
            j = _best(table, inside)
            held[out] = table[out, j]
            folds.append({"queries": len(out), "params": settings[j].describe(),
                          "train": float(table[inside, j].mean()),
                          "held_out": float(table[out, j].mean()),
                          "held_out_default": float(table[out, 0].mean())})
        report["cross_validation"] = {"folds": n_folds, "seed": seed,
                                      "default": float(table[:, 0].mean()),
                                      "tuned": float(held.mean()), "per_fold": folds}
    else:
        d = per_query(coll, test, test_qrels, default, m)
        t = per_query(coll, test, test_qrels, settings[best], m)
        report["test"] = {"queries": len(test), "default": float(np.mean(list(d.values()))),
                          "tuned": float(np.mean(list(t.values())))}
    if store:
        coll.table.commit_metadata(lexical_params=settings[best].describe())
    report["stored"] = store
    return report


def tune_command(eng, collection: str, queries: Path, qrels: Path, test: Path | None, *,
                 folds: int, seed: int, measure: str, grid: Grid, store: bool,
                 progress: bool) -> dict:
    from polyindex.ingest.sources import read_qrels, read_queries
    coll = eng.collection(collection)
    return tune(coll, read_queries(queries), read_qrels(qrels),
                test_qrels=None if test is None else read_qrels(test), n_folds=folds,
                seed=seed, measure=measure, grid=grid, store=store, progress=progress)


def render(report: dict, console) -> None:
    """The report as people read it: default vs tuned, and each fold's pick."""
    from rich.table import Table
    measure = report["measure"]
    table = Table(title=f"tune-bm25 {report['collection']}: {report['settings']} settings, "
                        f"{report['train_queries']} training queries")
    table.add_column("")
    table.add_column("params", overflow="fold")
    table.add_column(measure, justify="right")
    table.add_column("default", justify="right")
    cv, test = report.get("cross_validation"), report.get("test")
    if cv is not None:
        table.add_row("default", report["default"]["params"], f"{cv['default']:.4f}", "")
        table.add_row(f"tuned, {cv['folds']}-fold held-out", "", f"{cv['tuned']:.4f}",
                      f"{cv['default']:.4f}")
        for i, f in enumerate(cv["per_fold"], 1):
            table.add_row(f"  fold {i} ({f['queries']} q)", f["params"], f"{f['held_out']:.4f}",
                          f"{f['held_out_default']:.4f}")
    else:
        table.add_row(f"tuned, test ({test['queries']} q)", report["tuned"]["params"],
                      f"{test['tuned']:.4f}", f"{test['default']:.4f}")
    table.add_row("all training q, in-sample", report["tuned"]["params"],
                  f"{report['tuned']['train']:.4f}", f"{report['default']['train']:.4f}")
    console.print(table)
    if report["stored"]:
        console.print(f"stored lexical scorer {report['tuned']['params']!r} in "
                      f"{report['collection']!r}")
    else:
        console.print("not stored (--no-store)")
