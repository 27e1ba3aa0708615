"""Document quality at write time (issue 21 part 4; the estimate itself is
``rerank.doc_quality``): the writer's hook that scores a segment's documents and says which
are pruned, and the bulk run's plan that fixes the collection language model and the pruning
threshold before the first segment.

Both take the collection's folder, not the collection: the writer holds the hook, and a
hook holding the collection kept it (and its directory lock) alive in a reference cycle.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from polyindex.errors import InputError, InvalidArgument
from polyindex.rerank.doc_quality import (
    ARTIFACT,
    SHIPPED,
    Gate,
    LanguageModel,
    QualityModel,
    threshold_for,
)
from polyindex.types import document_text

CHUNK = 10_000  # texts per step of the bulk plan's passes (memory stays bounded)


def assess(folder: Path, w, m, texts):
    """``Writer.quality``: (quality, pruned, artifact files to commit or None)."""
    gate = _gate(folder, w, m)
    if gate is None:  # a first write that is not a bulk run: its own statistics
        gate = _new_gate(folder, w, [texts])
    files = None if m.artifacts.get(ARTIFACT) else getattr(w, "quality_files", None)
    gate.threshold = m.config.prune_threshold
    q = gate.quality(texts)
    return q, gate.pruned(q), files


def plan(folder: Path, name: str, w, source, fields, spec, *, prune, model) -> None:
    """``bulk_index``'s plan: before a bulk run's first segment, the collection language
    model from the whole input (when the collection has none yet) and, with ``prune``, the
    threshold: the ``prune`` quantile of the input's qualities, stored in the config
    (committed with the first segment) so later writes prune alike. A rerun of the same P
    keeps it."""
    m = w.manifest
    if prune is not None and m.config.prune_threshold is not None:
        if m.config.prune_quality != prune:
            raise InvalidArgument(
                f"collection {name!r} already prunes the lowest "
                f"{m.config.prune_quality:g} by quality; cannot index with "
                f"--prune-quality {prune:g}")
        prune = None  # the stored threshold holds
    if prune:
        w.quality = partial(assess, folder)
    elif w.quality is None:
        return
    gate = _gate(folder, w, m)
    if gate is not None and not prune:
        return
    # Streamed passes over the input (memory: a chunk of texts and, when pruning, a float
    # per document): its language model (the whole input's, so a document's quality does
    # not depend on which documents came first), then the qualities whose quantile is
    # the threshold.
    if gate is None:
        gate = _new_gate(folder, w, _text_chunks(source, fields, spec), model)
    if prune:
        q = [gate.quality(texts) for texts in _text_chunks(source, fields, spec)]
        m.config.prune_quality = prune
        m.config.prune_threshold = threshold_for(
            np.concatenate(q) if q else np.zeros(0, np.float32), prune)


def share(folder: Path, w, texts: list[str]) -> bool:
    """A shard's language model, the same on every shard of a sharded collection: the
    router's first batch, whole (each shard's first segment holds only its part), committed
    before the shard writes; False when the collection has one already."""
    if w.manifest.artifacts.get(ARTIFACT):
        return False
    gate = _new_gate(folder, w, [texts])
    w.commit_metadata(artifacts={ARTIFACT: w.quality_files})
    w.quality_files, w.quality_gate = None, gate
    return True


def _gate(folder: Path, w, m) -> Gate | None:
    """The writer's quality estimator: planned by this bulk run (not committed yet), or
    the collection's committed one; None when the collection has none yet."""
    gate = getattr(w, "quality_gate", None)
    if gate is None and m.artifacts.get(ARTIFACT):
        gate = w.quality_gate = Gate.load(folder / "artifacts" / ARTIFACT,
                                          m.config.prune_threshold)
    return gate


def _new_gate(folder: Path, w, chunks, model=None) -> Gate:
    """A first estimator: the language model of the texts in ``chunks`` (lists of texts),
    the given or shipped model, written under ``artifacts/quality/`` (committed with the
    next segment)."""
    lm = LanguageModel()
    for texts in chunks:
        lm.add(texts)
    gate = Gate(lm, QualityModel.load(Path(model) if model else SHIPPED), None)
    w.quality_files = gate.save(folder / "artifacts" / ARTIFACT)
    w.quality_gate = gate
    return gate


def _text_chunks(source, fields, spec, size: int = CHUNK):
    chunk: list[str] = []
    for _, d in source.records(0, fields, vectors=spec):
        if isinstance(d, InputError):
            continue
        chunk.append(document_text(d.title, d.text))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
