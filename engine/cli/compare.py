"""``eval`` comparing two or more profiles (or runs): each one's means, its latency, and
paired significance tests against the first (the baseline).

The test is scipy's paired t-test (``ttest_rel``, two-sided) over the per-query values of
each measure, the judged queries being the pairs (a query without hits counts as zero on
both sides); the table marks a mean whose p is below ``ALPHA``.
"""
from __future__ import annotations

import math

import numpy as np
from rich.console import Console
from rich.table import Table

ALPHA = 0.05


def paired_tests(per_query: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict]:
    """``{entry: {measure: {"t", "p", "wins", "losses"}}}`` for every entry but the first,
    against the first; ``per_query`` is ``{entry: {measure: {query: value}}}``."""
    from scipy.stats import ttest_rel
    entries = list(per_query)
    if len(entries) < 2:
        return {}
    base = per_query[entries[0]]
    out: dict[str, dict] = {}
    for entry in entries[1:]:
        out[entry] = {}
        for measure, values in per_query[entry].items():
            qs = sorted(base[measure])
            a = np.array([base[measure][q] for q in qs])
            b = np.array([values.get(q, 0.0) for q in qs])
            if len(qs) < 2 or np.allclose(a, b):  # no difference: nothing to test
                t, p = 0.0, 1.0
            else:
                res = ttest_rel(b, a)
                t, p = float(res.statistic), float(res.pvalue)
                if math.isnan(p):  # constant differences: all one way
                    t, p = (math.copysign(math.inf, float((b - a).mean())), 0.0)
            out[entry][measure] = {"t": t, "p": p, "wins": int((b > a + 1e-9).sum()),
                                   "losses": int((b < a - 1e-9).sum())}
    return out


def render(out: Console, title: str, first: str, results: dict[str, dict[str, float]],
           latency: dict[str, float] | None, tests: dict[str, dict],
           in_sample: dict[str, dict] | None = None) -> None:
    """The means (a row per entry, its latency last), then, with a baseline, a table of the
    paired tests' p-values and the queries won and lost against it; a mean whose p is below
    ``ALPHA`` is marked ``*``; an entry of ``in_sample`` (its shipped ranker was trained on
    this collection) is labelled so, and a line says which model."""
    in_sample = in_sample or {}
    label = {e: f"{e} (in-sample)" if e in in_sample else e for e in results}
    table = Table(title=title)
    table.add_column(first)
    names = list(next(iter(results.values())))
    for n in names:
        table.add_column(n, justify="right")
    if latency:
        table.add_column("ms/query", justify="right")
    for entry, r in results.items():
        marks = {n: "*" if tests.get(entry, {}).get(n, {}).get("p", 1.0) < ALPHA else ""
                 for n in names}
        table.add_row(label[entry], *(f"{r[n]:.4f}{marks[n]}" for n in names),
                      *([f"{latency[entry]:.1f}"] if latency else []))
    out.print(table)
    if latency:
        out.print("ms/query: the run's wall time per query (queries in batches of 64)",
                  highlight=False)
    for entry, why in in_sample.items():
        out.print(f"in-sample: {entry}'s shipped ranker {why['model']!r} was trained on the "
                  f"judgements of {', '.join(why['trained_on'])}, this collection among them: "
                  f"its score here is not a result", highlight=False)
    if not tests:
        return
    base = next(iter(results))
    sig = Table(title=f"paired t-test against {base} (p, queries won/lost); * above: "
                      f"p < {ALPHA}")
    sig.add_column(first)
    for n in names:
        sig.add_column(n, justify="right")
    for entry, by_measure in tests.items():
        sig.add_row(label[entry], *(f"{by_measure[n]['p']:.3f} (+{by_measure[n]['wins']}/"
                             f"-{by_measure[n]['losses']})" for n in names))
    out.print(sig)
