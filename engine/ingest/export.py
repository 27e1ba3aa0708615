"""Export a collection to a Parquet file that ``polyindex index`` reads back.

Works over any collection (embedded, remote or sharded): it is handed the collection's
``info()``, its count and its ``scroll`` method, and reads page by page, so memory is one
page whatever the collection's size. The columns:

- ``id``, ``title``, ``text``;
- each declared field as a typed column (``int`` -> int64, ...);
- ``_polyindex.metadata_json``: the rest of the metadata, as JSON (null when none);
- each user vector field as ``vector`` (the unnamed field) or ``vector.<field>``,
  FixedSizeList<float32> (null rows: an optional field the document left out);
- each vector the collection computed itself (its model's embeddings) as
  ``_polyindex.embedding.<field>``: kept for readers of the file; ``index`` ignores it and
  encodes the text again (the same model and dtype give the same vectors).

The ``_polyindex.`` columns are this format's own (``RESERVED``): sources read the metadata
one and leave out the rest. User token matrices (``multivector:source=user``) are stored
compressed, not as given, and are not exported.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from polyindex.errors import InvalidArgument

RESERVED = "_polyindex."
METADATA_COLUMN = RESERVED + "metadata_json"
EMBEDDING_PREFIX = RESERVED + "embedding."
PAGE = 1000  # documents per scroll page (and Parquet row group)
_TYPES = {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}


def _schema(info: dict, stored: dict[str, int]) -> pa.Schema:
    cols = [pa.field("id", pa.string(), nullable=False), pa.field("title", pa.string()),
            pa.field("text", pa.string())]
    cols += [pa.field(name, _TYPES[t]) for name, t in info["fields"].items()]
    cols.append(pa.field(METADATA_COLUMN, pa.string()))
    user = info.get("vector_fields") or {}
    for name, dim in sorted(stored.items()):
        col = ("vector" if name == "dense" else f"vector.{name}") if name in user \
            else EMBEDDING_PREFIX + name
        cols.append(pa.field(col, pa.list_(pa.float32(), dim)))
    return pa.schema(cols, metadata={b"polyindex.export": json.dumps(
        {"collection": info["name"], "fields": info["fields"], "indexes": info["indexes"],
         "model": info.get("model"), "vector_fields": user}).encode()})


def _vector_dims(scroll, info: dict) -> dict[str, int]:
    """Every stored vector field and its dimension: the user fields' declared ones, and the
    model's, read from a stored document (an empty collection has none to read)."""
    dims = {name: f["dim"] for name, f in (info.get("vector_fields") or {}).items()
            if f.get("dim")}
    if any(ix.split(":")[0].split("@")[0] == "dense" for ix in info["indexes"]):
        for doc in scroll(limit=8, with_vectors=True).documents:
            for name, v in (doc.vectors or {}).items():
                dims.setdefault(name, len(v))
    return dims


def _batch(docs, schema: pa.Schema, info: dict, stored: dict[str, int]) -> pa.RecordBatch:
    declared = info["fields"]
    cols: dict[str, pa.Array] = {
        "id": pa.array([d.id for d in docs], pa.string()),
        "title": pa.array([d.title for d in docs], pa.string()),
        "text": pa.array([d.text for d in docs], pa.string())}
    for name, t in declared.items():
        cols[name] = pa.array([(d.metadata or {}).get(name) for d in docs], _TYPES[t])
    rest = [{k: v for k, v in (d.metadata or {}).items() if k not in declared} for d in docs]
    cols[METADATA_COLUMN] = pa.array(
        [json.dumps(r, ensure_ascii=False) if r else None for r in rest], pa.string())
    user = info.get("vector_fields") or {}
    for name, dim in sorted(stored.items()):
        col = ("vector" if name == "dense" else f"vector.{name}") if name in user \
            else EMBEDDING_PREFIX + name
        present = np.array([name in (d.vectors or {}) for d in docs])
        flat = np.zeros((len(docs), dim), np.float32)
        for i, d in enumerate(docs):
            if present[i]:
                flat[i] = d.vectors[name]
        cols[col] = pa.FixedSizeListArray.from_arrays(
            pa.array(flat.reshape(-1)), dim, mask=pa.array(~present))
    return pa.record_batch([cols[f.name] for f in schema], schema=schema)


def export(path, info: dict, total: int, scroll: Callable,
           progress: Callable[[int, int], None] | None = None, *, page: int = PAGE) -> int:
    """Write a collection (``info``: its ``info()``, ``total``: its count, ``scroll``: its
    ``scroll`` method) to ``path`` (a new file, renamed into place when complete); returns
    the number of documents. ``progress(done, total)`` is called after each page."""
    import pyarrow.parquet as pq  # deferred: only export needs the Parquet writer
    path = Path(path)
    if path.suffix != ".parquet":
        raise InvalidArgument(f"{path}: the export is a Parquet file; name it *.parquet")
    if not path.parent.is_dir():
        raise InvalidArgument(f"{path.parent}: no such directory")
    stored = _vector_dims(scroll, info)
    schema = _schema(info, stored)
    done, cursor = 0, None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            while True:
                got = scroll(limit=page, cursor=cursor, with_vectors=bool(stored))
                if got.documents:
                    writer.write_batch(_batch(got.documents, schema, info, stored))
                    done += len(got.documents)
                    if progress is not None:
                        progress(done, total)
                if got.cursor is None:
                    break
                cursor = got.cursor
        # the file and its folder on disk before the name says it is complete (not a store
        # file: no manifest names it, so not storage/fsutil's)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)
    return done
