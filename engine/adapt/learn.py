"""``learn``: fine-tune a copy of a collection's encoder on its own corpus, without labels.

Synthetic queries (``synth``), a share held back (``guard``) -> the teacher ranks the rest,
the pairs it is sure of are kept with a hard negative (``teacher``) -> the student is
fine-tuned on them (``student``); with ``recipe.rounds`` > 1 the student's own ranking, fused
with the teacher's, labels the next round. Then the student and the base model are compared
on the held-back queries (``guard``): the caller commits only a student the guard passes.
The hyperparameters are ``recipe.DEFAULT`` for every collection.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from polyindex.adapt import guard
from polyindex.adapt import student as student_mod
from polyindex.adapt.recipe import DEFAULT, Recipe
from polyindex.adapt.synth import make_queries
from polyindex.adapt.teacher import fused_teacher, label
from polyindex.errors import InvalidArgument

TEACH_CHUNK = 512  # queries per teacher call: one progress report each


def learn(texts: Sequence[str], teacher: Callable[[Sequence[str], int], list[list[int]]],
          base_model: str, out_dir: Path, recipe: Recipe | None = None,
          progress: Callable[[str, int, int], None] | None = None,
          device: str = "cpu", seed: int = 0, *,
          titles: Sequence[str | None] | None = None,
          lexical: Callable[[Sequence[str], int], list[list[int]]] | None = None) -> dict:
    """Fine-tune a copy of base_model (a local sentence-transformers folder, or the default
    model's name) on synthetic queries made from texts, labelled by teacher(queries, depth) ->
    for each query the row indices of texts it ranks first, best first; save the student (a
    sentence-transformers folder) in out_dir (plain writes: the caller fsyncs and checksums
    it); return a JSON-able report. ``titles`` (optional, row-aligned) adds title queries.
    Raises InvalidArgument when texts are too few to learn from. The report's ``guard``
    (``adapt.guard``) says whether the student beat base_model on held-back synthetic
    queries (``lexical``, teacher-shaped: the collection's lexical ranking, fused with each
    encoder's dense one as its hybrid profile does); the student is saved either way, the
    caller commits it only when ``guard["passed"]``."""
    from polyindex.encode.text import resolve_model
    recipe = recipe or DEFAULT
    t_start, cpu_start = time.perf_counter(), time.process_time()
    texts = [t if isinstance(t, str) else "" for t in texts]
    usable = sum(len(t.split()) >= 4 for t in texts)
    if usable < recipe.min_docs:
        raise InvalidArgument(
            f"adapt needs at least {recipe.min_docs} documents with text to learn from; this "
            f"corpus has {usable} (of {len(texts)}): too few to adapt the encoder without "
            f"overfitting it, so the collection keeps its encoder")
    if recipe.neg_source not in ("teacher", "lexical"):
        raise InvalidArgument(f"recipe neg_source must be 'teacher' or 'lexical', got "
                              f"{recipe.neg_source!r}")
    if titles is not None and len(titles) != len(texts):
        raise InvalidArgument(f"titles has {len(titles)} entries for {len(texts)} texts")
    report: dict = {"documents": len(texts), "usable_documents": usable, "device": device,
                    "seed": seed, "recipe": recipe.to_json(), "base_model": base_model,
                    "rounds": []}
    tick = progress or (lambda phase, done, total: None)

    queries, held, held_docs = guard.hold_back(
        make_queries(texts, recipe, seed=seed, titles=titles), recipe, seed)
    tick("queries", len(queries), len(queries))
    t0 = time.perf_counter()
    ranked = _rank_all(teacher, queries, recipe.depth,
                       lambda done: tick("teacher", done, len(queries)))
    if len(ranked) != len(queries):
        raise InvalidArgument(f"the teacher answered {len(ranked)} rankings for "
                              f"{len(queries)} queries")
    report["teacher_seconds"] = round(time.perf_counter() - t0, 1)
    negatives = None
    if recipe.neg_source == "lexical":
        if lexical is None:
            raise InvalidArgument("recipe neg_source=lexical needs the collection's lexical "
                                  "ranking (a collection with a lexical index)")
        negatives = _rank_all(lexical, queries, recipe.neg_ranks[1])

    model = student_mod.load(resolve_model(base_model), device)
    served_len = model.max_seq_length
    for rnd in range(recipe.rounds):
        pairs, counts = label(queries, ranked, recipe, seed=seed + rnd, unseen=held_docs,
                              negatives=negatives)
        if len(pairs) < recipe.min_pairs:
            raise InvalidArgument(
                f"the teacher was sure of only {len(pairs)} of {len(queries)} synthetic "
                f"queries (need {recipe.min_pairs}): too little to learn from; the collection "
                f"keeps its encoder")
        phase = "train" if recipe.rounds == 1 else f"train {rnd + 1}/{recipe.rounds}"
        trained = student_mod.train(model, texts, pairs, recipe, device, seed + rnd, tick, phase)
        report["rounds"].append({**counts, **trained})
        if rnd + 1 < recipe.rounds:  # the student becomes (half of) the teacher
            t0 = time.perf_counter()
            mine = _student_ranks(model, texts, [q.text for q in queries], recipe.depth, device)
            ranked = fused_teacher(ranked, mine)
            report["rounds"][-1]["relabel_seconds"] = round(time.perf_counter() - t0, 1)

    model.max_seq_length = served_len  # trained on shorter inputs, served as the base was
    old = student_mod.load(resolve_model(base_model), device)
    old.max_seq_length = served_len
    if recipe.average:  # a weight-space average with the base: a milder step
        student_mod.average(model, old, recipe.average)
    out_dir = Path(out_dir)
    student_mod.save(model, out_dir)
    report["guard"] = judge(old, model, texts, held, recipe, seed, lexical, device)
    del old
    tick("guard", 1, 1)
    last = report["rounds"][-1]
    report.update(queries=len(queries) + len(held), held_back=len(held), pairs=last["kept"],
                  steps=sum(r["steps"] for r in report["rounds"]),
                  seconds=round(time.perf_counter() - t_start, 1),
                  cpu_seconds=round(time.process_time() - cpu_start, 1),
                  peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  max_seq_length=served_len, out_dir=str(out_dir))
    return report


def _rank_all(rank, queries, depth: int, done=lambda n: None) -> list[list[int]]:
    """``rank`` (a teacher-shaped callable) over every query, ``TEACH_CHUNK`` at a time."""
    out: list[list[int]] = []
    for s in range(0, len(queries), TEACH_CHUNK):
        out += rank([q.text for q in queries[s:s + TEACH_CHUNK]], depth)
        done(min(s + TEACH_CHUNK, len(queries)))
    return out


def judge(old, model, texts: Sequence[str], held, recipe: Recipe, seed: int, lexical,
          device: str) -> dict:
    """The guard's verdict (``guard.evaluate``) on the student ``model`` against ``old``."""
    t0 = time.perf_counter()
    out = guard.evaluate(lambda xs: student_mod.encode(old, xs, device),
                         lambda xs: student_mod.encode(model, xs, device), texts, held, recipe,
                         seed, lexical)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _student_ranks(model, texts: Sequence[str], queries: Sequence[str], depth: int,
                   device: str, chunk: int = 1024) -> list[list[int]]:
    docs = student_mod.encode(model, texts, device)
    qs = student_mod.encode(model, queries, device)
    depth = min(depth, len(texts))
    out = []
    for s in range(0, len(qs), chunk):
        sims = qs[s:s + chunk] @ docs.T
        top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth]
        order = np.take_along_axis(sims, top, 1).argsort(1)[:, ::-1]
        out += np.take_along_axis(top, order, 1).tolist()
    return out
