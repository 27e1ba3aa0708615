"""User-supplied token matrices for a ``multivector:source=user`` index (ColBERT/ColPali run
elsewhere): read from a record, checked against the collection's index.

A record carries ``"tokens": [[...], ...]`` (JSONL, ``add()``: nested lists or a numpy
array), one row per token, all rows of one dimension. Parquet and Arrow carry a ``tokens``
column, list<list<number>> or list<FixedSizeList<number>[d]> (a document's rows are a numpy
view of the batch's values when every token row has one length and nothing is null). A
matrix is refused when it is empty, not 2-D, ragged, holds NaN or infinity or a component
over ``MAX_ABS`` in magnitude, has too many tokens, or has the wrong dimension; a document
without tokens in a collection whose multivector index takes the user's is refused too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polyindex.errors import InputError
from polyindex.ingest.values import MAX_DIM, check_values
from polyindex.types import MAX_TOKENS

TOKENS_KEY = "tokens"


def as_tokens(value: Any) -> np.ndarray:
    """One token matrix as float32 (n_tokens, d), or ValueError saying what is wrong."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("empty token matrix (a document needs at least one token)")
        rows = [np.asarray(r) if isinstance(r, np.ndarray) else r for r in value]
        if not all(isinstance(r, (list, tuple, np.ndarray)) for r in rows):
            raise ValueError("tokens must be a list of token vectors (lists of numbers)")
        d = len(rows[0])
        bad = next((i for i, r in enumerate(rows) if len(r) != d), None)
        if bad is not None:
            raise ValueError(f"token {bad} has {len(rows[bad])} dimensions, token 0 has {d}")
        try:
            arr = np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("tokens must be lists of numbers") from None
    else:
        raise ValueError(f"tokens must be a list of token vectors, got {type(value).__name__}")
    if arr.ndim != 2 or arr.dtype.kind not in "iuf":
        raise ValueError(f"tokens must be an (n_tokens, d) matrix of numbers (got shape "
                         f"{arr.shape}, dtype {arr.dtype})")
    if not arr.shape[0] or not arr.shape[1]:
        raise ValueError(f"empty token matrix (shape {arr.shape}; a document needs at least "
                         "one token of at least one dimension)")
    if arr.shape[0] > MAX_TOKENS or arr.shape[1] > MAX_DIM:
        raise ValueError(f"token matrix of shape {arr.shape} is too large (at most "
                         f"{MAX_TOKENS} tokens of {MAX_DIM} dimensions)")
    check_values(arr, lambda at: f"token {at[0]} component {at[1]}")
    return np.ascontiguousarray(arr, dtype=np.float32)


@dataclass
class TokenSpec:
    """The collection's user multivector index: its name and token dimension (None: taken
    from the first matrix of a write, then fixed)."""

    index: str
    dim: int | None = None

    def check(self, tokens: np.ndarray | None, *, source, line, doc_id) -> InputError | None:
        if tokens is None:
            return InputError(f"missing tokens (the {self.index} index takes the user's token "
                              "matrices: a \"tokens\": [[...], ...] field)", source=source,
                              line=line, field=TOKENS_KEY, doc_id=doc_id)
        if self.dim is None:
            self.dim = int(tokens.shape[1])
        elif tokens.shape[1] != self.dim:
            return InputError(f"tokens have dimension {tokens.shape[1]}, the {self.index} index "
                              f"has {self.dim}", source=source, line=line, field=TOKENS_KEY,
                              doc_id=doc_id)
        return None


def token_spec(kinds: dict) -> TokenSpec | None:
    for name, kind in kinds.items():
        if kind.kind == "multivector" and getattr(kind, "source", "model") == "user":
            return TokenSpec(name, kind.dim)
    return None


def token_column_rows(col) -> list:
    """A ``tokens`` column of an Arrow batch as per-row (n, d) float32 arrays (views of the
    batch's values when the rows are uniform), or Python lists / None (null) for the record
    check to name what is wrong."""
    import pyarrow.types as pt
    inner = col.type.value_type
    uniform = col.null_count == 0 and col.values.null_count == 0
    if uniform and pt.is_fixed_size_list(inner):
        d = inner.list_size
    elif uniform and (pt.is_list(inner) or pt.is_large_list(inner)):
        lengths = np.diff(col.values.offsets.to_numpy())
        d = int(lengths[0]) if len(lengths) else 0
        uniform = bool(len(lengths)) and bool((lengths == d).all())
    else:
        uniform = False
    if uniform and d and col.values.values.null_count == 0 and \
            (pt.is_floating(inner.value_type) or pt.is_integer(inner.value_type)):
        flat = col.values.flatten().to_numpy(zero_copy_only=False)  # the tokens' values
        if flat.dtype != np.float32 and not (flat.dtype.kind == "f" and flat.size
                                             and np.nanmax(np.abs(flat)) > 3e38):
            flat = flat.astype(np.float32)
        m = flat.reshape(-1, d)  # every token row of the column's (unsliced) child
        offsets = col.offsets.to_numpy()  # this (maybe sliced) column's rows, into the child
        return [m[offsets[i]:offsets[i + 1]] for i in range(len(col))]
    return col.to_pylist()


def check_token_schema(t, source: str) -> None:
    """Refuse a ``tokens`` column that cannot hold token matrices, naming it."""
    import pyarrow.types as pt

    def num_list(x):
        return (pt.is_fixed_size_list(x) or pt.is_list(x) or pt.is_large_list(x)) and \
            (pt.is_floating(x.value_type) or pt.is_integer(x.value_type))
    if not ((pt.is_list(t) or pt.is_large_list(t)) and num_list(t.value_type)):
        raise InputError(f"column 'tokens' must be a list of token vectors (list<list<float>> "
                         f"or list<fixed_size_list<float>>), got {t}", source=source,
                         field=TOKENS_KEY)
