"""A Ray worker's share of ``polyindex index --ray``: one range of the source in, one built
segment folder out.

A *range* is the source's records ``[start, stop)`` by position (the same positions the bulk
path records in the manifest; ``stop`` None: to the end). The worker reads it itself through
``ingest.sources`` (the source must be on storage every node sees, like the data directory),
validates each record as bulk does, keeps the last record of each id, encodes on its device,
builds every kind's files with ``storage.writer.build_segment`` into a ``.seg-ray-*`` folder of
the collection's ``segments/`` and fsyncs it. Only a small descriptor goes back to the driver
(never the rows), which commits the folders in source order (``distributed.ingest``); a
folder a crash leaves uncommitted is removed by the next writer (the ``.seg-`` prefix).

Collection-wide trained artifacts (multivector codebook, sparse projector, tree, a trained
dense index) are trained by the worker given the first range (``train``), exactly as bulk
trains on its first segment; the others start after that commit and load them.
"""
from __future__ import annotations

import pickle
import uuid
from pathlib import Path

from polyindex.distributed.cluster import error_bytes
from polyindex.errors import FailedPrecondition, InputError
from polyindex.storage.fsutil import fsync_tree
from polyindex.storage.writer import batch_of, build_segment, train_kinds
from polyindex.types import document_text

TMP_PREFIX = ".seg-ray-"  # ".seg-": what Writer._remove_uncommitted removes after a crash


def open_collection(folder: str):
    """The collection read-only (its config, kinds and committed artifacts): a worker never
    takes the writer's lock, the driver holds it."""
    from polyindex.collection import Collection
    return Collection(Path(folder), readonly=True, follow_wal=False)


def _records(source, start: int, stop: int | None, fields, spec, skip_invalid: bool):
    """(documents, last id wins, in bulk's order; invalid skipped; position after the range)."""
    buffer: dict = {}
    skipped, position = 0, start
    for pos, item in source.records(start, fields, vectors=spec):
        if stop is not None and pos >= stop:
            break
        position = pos + 1
        if isinstance(item, InputError):
            if not skip_invalid:
                raise item
            skipped += 1
            continue
        buffer.pop(item.id, None)  # last write wins; the survivor moves to the end, as in bulk
        buffer[item.id] = item
    return list(buffer.values()), skipped, position


def build_range(coll, encode, source, task: dict) -> dict:
    """Build ``task``'s range into a fresh folder; the descriptor the driver commits."""
    if source.fingerprint() != task["fingerprint"]:
        raise FailedPrecondition(f"{source.name} changed while it was being indexed")
    folder = coll.folder
    spec = coll.encoding.vector_spec()
    docs, skipped, position = _records(source, task["start"], task["stop"],
                                       coll.config.fields, spec, task["skip_invalid"])
    out = {"index": task["index"], "position": position, "skipped": skipped, "n_rows": len(docs),
           "folder": None, "infos": {}, "artifacts": {}}
    if not docs:
        return out
    vectors = spec.stack(docs) if spec else None
    embeddings = tokens = None
    if encode is not None:
        res = encode([document_text(d.title, d.text) for d in docs])
        embeddings, tokens = res if isinstance(res, tuple) else (res, None)
    if task["train"]:
        out["artifacts"] = train_kinds(folder, coll.kinds,
                                       batch_of(docs, embeddings, tokens, vectors))
    else:
        untrained = [k.name for k in coll.kinds.values() if k.needs_training()]
        if untrained:  # e.g. an optional vector field the first range did not have
            raise FailedPrecondition(f"index {untrained[0]!r} is still untrained after the "
                                     "first segment; index this source without --ray")
    tmp = folder / "segments" / f"{TMP_PREFIX}{task['index']:06d}.{uuid.uuid4().hex[:8]}.tmp"
    out["infos"] = build_segment(tmp, docs, coll.config.fields, coll.kinds, embeddings, tokens,
                                 vectors, collection_rows=task["collection_rows"])
    fsync_tree(tmp, "commit.segment")  # durable from the node that wrote it
    out["folder"] = tmp.name
    return out


class SegmentBuilder:
    """The Ray Data actor (one per encoder): loads the model once, then builds ranges.

    Batches are Ray Data's dict of numpy columns: ``task`` (pickled task dicts) in,
    ``out`` (pickled descriptors, or an ``error``) out: one row per range."""

    def __init__(self, folder: str, source, device: str = "cpu"):
        self.folder, self.source, self.device = folder, source, device
        self.coll = open_collection(folder)
        self.encode = self.coll.encoding.document_encoder(device)
        if self.encode is not None:
            _ = self.coll.encoder  # the model loads here, once per actor

    def __call__(self, batch: dict) -> dict:
        import numpy as np
        outs = []
        for raw in batch["task"]:
            task = pickle.loads(raw)
            try:
                desc = build_range(self.coll, self.encode, self.source, task)
            except Exception as e:  # noqa: BLE001 - sent to the driver, raised in order
                desc = {"index": task["index"], "error": error_bytes(e)}
            outs.append(pickle.dumps(desc))
        return {"out": np.array(outs, dtype=object)}
