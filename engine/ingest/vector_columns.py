"""Vector columns of Arrow data (Parquet, Arrow IPC) as numpy rows, without Python floats.

Columns: ``vector`` (the unnamed field), ``vector.<field>``, or a struct column ``vectors``
whose children are fields. Each is FixedSizeList or (large) list of integers or floats. A
column whose rows all have one length and no nulls becomes one (n, d) float32 matrix, a view
of the Arrow buffer when it is float32 already; otherwise each row is handed on by itself
(its length and nulls are then checked per record, with its row number).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

from polyindex.errors import InputError


def _is_vector_column(name: str) -> bool:
    return name in ("vector", "vectors") or name.startswith("vector.")


def _field_of(name: str) -> str:
    return "dense" if name == "vector" else name[len("vector."):]


def _numeric_list(t: pa.DataType) -> bool:
    return (pt.is_fixed_size_list(t) or pt.is_list(t) or pt.is_large_list(t)) and \
        (pt.is_floating(t.value_type) or pt.is_integer(t.value_type))


def check_vector_schema(schema: pa.Schema, source: str) -> None:
    """Refuse vector (and token) columns of a type that cannot hold them, naming the column."""
    if "tokens" in schema.names:
        from polyindex.ingest.tokens import check_token_schema
        check_token_schema(schema.field("tokens").type, source)
    for f in schema:
        if not _is_vector_column(f.name):
            continue
        if f.name == "vectors":
            if not pt.is_struct(f.type):
                raise InputError(f"column 'vectors' must be a struct of vector columns, got "
                                 f"{f.type}", source=source, field="vectors")
            subs = [(f"vectors.{c.name}", c.type) for c in f.type]
        else:
            subs = [(f.name, f.type)]
        for name, t in subs:
            if not _numeric_list(t):
                raise InputError(f"column {name!r} must be a list or fixed-size list of numbers, "
                                 f"got {t}", source=source, field=name)


def split_vector_columns(batch: pa.RecordBatch) -> tuple[dict[str, Any], pa.RecordBatch]:
    """({field: (n, d) matrix or per-row list}, the batch without its vector columns)."""
    names = [n for n in batch.schema.names if _is_vector_column(n)]
    if not names:
        return {}, batch
    out: dict[str, Any] = {}
    for name in names:
        col = batch.column(name)
        if name == "vectors":
            for i, child in enumerate(col.type):
                out[child.name] = _rows(col.field(i), col)
        else:
            out[_field_of(name)] = _rows(col, None)
    keep = [i for i, n in enumerate(batch.schema.names) if n not in names]
    return out, batch.select(keep)


def _rows(arr: pa.Array, parent: pa.Array | None):
    """One column's vectors: a matrix when uniform, else a list (None for null rows)."""
    n = len(arr)
    nulls = arr.null_count + (parent.null_count if parent is not None else 0)
    if pt.is_fixed_size_list(arr.type):
        d = arr.type.list_size
        uniform = True
    else:
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        d = int(lengths[0]) if n else 0
        uniform = bool(n) and (lengths == d).all()
    values = arr.flatten()  # respects the array's offset (a slice of a batch)
    if uniform and not nulls and values.null_count == 0 and d:
        flat = values.to_numpy(zero_copy_only=False)
        if flat.dtype != np.float32:
            flat = _as_float32(flat)
        return flat.reshape(n, d)
    rows = arr.to_pylist()
    if parent is not None:
        valid = parent.is_valid().to_pylist()
        rows = [r if ok else None for r, ok in zip(rows, valid)]
    return rows


def _as_float32(flat: np.ndarray) -> np.ndarray:
    # Out-of-range values must fail the magnitude check, not become inf silently: keep float64
    # for the check when any value would overflow float32.
    if flat.dtype.kind == "f" and flat.size and np.nanmax(np.abs(flat)) > np.finfo(np.float32).max:
        return flat.astype(np.float64)
    return flat.astype(np.float32)
