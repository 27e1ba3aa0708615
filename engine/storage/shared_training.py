"""A collection's trained artifacts, fixed once from its first batch and the same on every
segment and every shard (issue 43 part 1).

Kinds that train something collection-level (the sparse UHD projector, an IVF/PQ template)
train it once and every later segment uses it. Which documents train it must not depend on
how rows fall into segments or shards, so the rule is: **the first write batch of the
collection** from which a kind can train (a multivector codebook: one of at least
``SHARED_MIN_TOKENS`` tokens; an embedded ``add`` is one segment, so its first
segment; an online writer trains at its first upsert, before the WAL append, not at its
first seal, which holds whatever was buffered; a sharded router sends its first batch, whole,
to shard 0, which trains and commits, and installs the same files, byte for byte, in every
other shard before any shard writes). The files are ordinary collection artifacts
(``artifacts/<kind>/``: fsynced and checksummed by the writer, named by the manifest).

``train_first`` trains and commits; ``export`` reads a collection's committed artifacts (as
bytes, for the router to ship); ``install`` commits shipped ones in a collection that has
none of its own yet.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from polyindex.errors import Corrupt
from polyindex.storage.writer import batch_of
from polyindex.types import Document

# The kinds trained from the first batch. Multivector's codebook only from a batch it
# ``trains_from`` (enough tokens; the kind encodes a model's tokens itself for it).
SHARED_KINDS = ("sparse", "dense", "multivector")


def untrained(kinds: dict) -> list[str]:
    """Names of the kinds (of ``SHARED_KINDS``) that still need their collection-level
    training."""
    return [name for name, k in kinds.items()
            if k.kind in SHARED_KINDS and k.needs_training()]


def train_first(table, docs: Sequence[Document], embeddings: np.ndarray | None,
                vectors: dict[str, np.ndarray] | None = None) -> list[str]:
    """Train every kind that needs it on ``docs`` (the collection's first batch) and commit
    its artifacts in one manifest version before anything of the batch is written; returns
    the artifact names committed (none: nothing to train, or too few vectors yet, e.g. an
    IVF on a batch smaller than its lists: the next batch tries again)."""
    if not docs or not untrained(table.kinds):
        return []
    with table.writer() as w:
        _load(table)
        if not untrained(table.kinds):  # committed meanwhile (installed from shard 0)
            return []
        batch = batch_of(docs, embeddings, None, vectors)
        files = {}
        for name in untrained(table.kinds):
            kind = table.kinds[name]
            if not getattr(kind, "trains_from", lambda _b: True)(batch):
                continue  # too small to fix this kind's artifact: a later batch or seal
            kind.train(batch)
            art = table.folder / "artifacts" / kind.artifact_name
            art.mkdir(parents=True, exist_ok=True)
            saved = kind.save_artifacts(art)
            if saved:  # nothing saved: too few vectors to train on yet
                files[kind.artifact_name] = saved
        if files:
            w.commit_metadata(artifacts=files)
    _load(table)
    return sorted(files)


def _load(table) -> None:
    """Read the manifest now and load the artifacts it names into the kinds (``refresh``
    alone defers that to the next snapshot: a write in between would train again)."""
    table.refresh()
    table.sealed_snapshot()


def export(table, names: Sequence[str] | None = None) -> dict[str, dict[str, bytes]]:
    """The committed artifacts of the kinds (every trained one of ``SHARED_KINDS`` by default), as
    {artifact name: {file: bytes}}, each file checked against the manifest's checksum."""
    from polyindex.storage.integrity import check_file
    m = table.sealed_snapshot().manifest
    want = set(names) if names is not None else {k.artifact_name for k in table.kinds.values()
                                                 if k.kind in SHARED_KINDS}
    out: dict[str, dict[str, bytes]] = {}
    for name, files in m.artifacts.items():
        if name not in want or not files:
            continue
        folder = table.folder / "artifacts" / name
        out[name] = {}
        for f in files:
            expect = m.artifact_sums.get(name, {}).get(f)
            if expect is not None:
                check_file(folder / f, expect)
            out[name][f] = (folder / f).read_bytes()
    return out


def install(table, blobs: dict[str, dict[str, bytes]]) -> list[str]:
    """Commit ``blobs`` (``export``'s answer from the shard that trained) as this
    collection's artifacts, except those it has already (trained before: kept, never
    replaced under its segments); returns the names installed."""
    from polyindex.storage.fsutil import write_file
    kinds = {k.artifact_name: k for k in table.kinds.values() if k.kind in SHARED_KINDS}
    have = table.sealed_snapshot().manifest.artifacts
    todo = {name: files for name, files in blobs.items()
            if name in kinds and kinds[name].needs_training() and not have.get(name)}
    if not todo:
        return []
    for name, files in todo.items():
        folder = table.artifact_dir(name)
        for f, data in files.items():
            if "/" in f or f.startswith("."):
                raise Corrupt(f"shipped artifact {name!r}: bad file name {f!r}")
            write_file(folder / f, data)
    table.commit_metadata(artifacts={name: sorted(files) for name, files in todo.items()})
    _load(table)
    return sorted(todo)
