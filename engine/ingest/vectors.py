"""User-supplied vectors: read from a record, checked against the collection's vector fields.

A record carries vectors as a top-level ``"vector": [...]`` (the unnamed field ``dense``)
and/or ``"vectors": {"image": [...], ...}`` (named fields, ``dense@image`` indexes). Values
are lists of numbers or numpy arrays (Parquet/Arrow rows arrive as numpy views). A vector is
refused when it is not a flat list of numbers, holds NaN or infinity, has a component larger
than ``MAX_ABS`` in magnitude, has the wrong dimension, is all zeros in a cosine field, or is
missing for a field the user fills (unless the field is ``optional``: the document then has
no vector there; ``stack`` gives it a NaN row, see ``index.dense.presence``). Cosine fields
are stored L2-normalized.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from polyindex.errors import InputError, InvalidArgument
from polyindex.ingest.tokens import token_spec
from polyindex.ingest.values import MAX_DIM, check_values

UNNAMED = "dense"
VECTOR_KEYS = ("vector", "vectors", "tokens")  # record keys that are vectors, never metadata


def as_vector(value: Any, field: str) -> np.ndarray:
    """One vector as float32 (1-D), or ValueError saying what is wrong with it."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("empty vector")
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in value):
            bad = next(x for x in value if isinstance(x, bool) or not isinstance(x, (int, float)))
            raise ValueError(f"vector must be a flat list of numbers (found {type(bad).__name__})")
        arr = np.asarray(value, dtype=np.float64)
    else:
        raise ValueError(f"vector must be a list of numbers, got {type(value).__name__}")
    if arr.ndim != 1 or arr.dtype.kind not in "iuf" or not len(arr):
        raise ValueError(f"vector must be a flat list of numbers (got shape {arr.shape}, "
                         f"dtype {arr.dtype})")
    if len(arr) > MAX_DIM:
        raise ValueError(f"vector has {len(arr)} dimensions (max {MAX_DIM})")
    check_values(arr, lambda i: f"vector component {i[0]}")
    return arr if arr.dtype == np.float32 else arr.astype(np.float32)


def vectors_of_record(rec: dict[str, Any]) -> tuple[dict[str, np.ndarray] | None, str | None, str | None]:
    """(vectors by field, or None; the failing field; its error) of a parsed record."""
    out: dict[str, np.ndarray] = {}
    if rec.get("vector") is not None:
        try:
            out[UNNAMED] = as_vector(rec["vector"], UNNAMED)
        except ValueError as e:
            return None, "vector", str(e)
    named = rec.get("vectors")
    if named is not None:
        if not isinstance(named, dict):
            return None, "vectors", f"'vectors' must be an object of field -> vector, got " \
                                    f"{type(named).__name__}"
        for name, value in named.items():
            if name == UNNAMED and UNNAMED in out:
                return None, f"vectors.{name}", "the unnamed field is given twice " \
                                                "('vector' and 'vectors.dense')"
            if value is None:
                continue
            try:
                out[str(name)] = as_vector(value, str(name))
            except ValueError as e:
                return None, f"vectors.{name}", str(e)
    return (out or None), None, None


@dataclass
class FieldSpec:
    name: str         # the field ("dense" for the unnamed one)
    index: str | None  # the dense index holding it (None: only other kinds read it)
    dim: int | None   # None: taken from the first vector given
    metric: str = "ip"
    optional: bool = False  # documents may leave it out (dim is then always declared)


class VectorSpec:
    """The vector fields a collection's user fills, checked per document. Dimensions not
    declared are fixed by the first vector seen (per write call or bulk run)."""

    def __init__(self, fields: dict[str, FieldSpec], tokens=None):
        self.fields = fields
        self.tokens = tokens  # ``ingest.tokens.TokenSpec`` of a multivector:source=user index

    @classmethod
    def of(cls, kinds: dict, model: str | None) -> "VectorSpec":
        fields: dict[str, FieldSpec] = {}
        for name, kind in kinds.items():
            if kind.kind != "dense":
                continue
            if kind.source == "model" and model is None:
                raise InvalidArgument(f"{name}: source=model, but the collection has no model")
            if kind.field != UNNAMED or kind.source == "user" or model is None:
                fields[kind.field] = FieldSpec(kind.field, name, kind.dim, kind.metric,
                                               getattr(kind, "optional", False))
        if model is None and UNNAMED not in fields and \
                any(k.needs_embeddings for k in kinds.values()):
            fields[UNNAMED] = FieldSpec(UNNAMED, None, None)  # e.g. a tree over user vectors
        return cls(fields, token_spec(kinds))

    def __bool__(self) -> bool:
        return bool(self.fields) or self.tokens is not None

    def check_tokens(self, tokens, *, source: str | None, line: int | None,
                     doc_id: str | None) -> InputError | None:
        """The problem of one document's token matrix (checked well-formed already), or None."""
        if self.tokens is None:
            if tokens is None:
                return None
            return InputError("the collection has no multivector index that takes the user's "
                              "tokens (multivector:source=user)", source=source, line=line,
                              field="tokens", doc_id=doc_id)
        return self.tokens.check(tokens, source=source, line=line, doc_id=doc_id)

    def check(self, vectors: dict[str, np.ndarray] | None, *, source: str | None,
              line: int | None, doc_id: str | None) -> InputError | None:
        """The first problem of one document's vectors, or None. Fixes unknown dimensions;
        normalizes cosine fields' vectors in ``vectors`` (in place)."""
        def error(field, msg):
            return InputError(msg, source=source, line=line, field=field, doc_id=doc_id)
        vectors = vectors or {}
        for name in vectors:
            if name not in self.fields:
                have = ", ".join(sorted(self.fields)) or "none: its vectors come from its model"
                return error("vector" if name == UNNAMED else f"vectors.{name}",
                             f"the collection has no user vector field {name!r} "
                             f"(its user vector fields: {have})")
        for name, spec in self.fields.items():
            where = "vector" if name == UNNAMED else f"vectors.{name}"
            v = vectors.get(name)
            if v is None and spec.optional:
                continue
            if v is None:
                return error(where, f"missing vector for field {name!r}"
                             + (" (a top-level \"vector\")" if name == UNNAMED else ""))
            if spec.dim is None:
                spec.dim = len(v)
            elif len(v) != spec.dim:
                return error(where, f"vector has dimension {len(v)}, field {name!r} has {spec.dim}")
            if spec.metric == "cosine":  # stored unit length, as the index compares them
                norm = float(np.linalg.norm(v))
                if norm == 0:
                    return error(where, "a zero vector has no direction (cosine field)")
                vectors[name] = (v / norm).astype(np.float32)
        return None

    def stack(self, docs: Sequence) -> dict[str, np.ndarray]:
        """Checked documents' vectors as one float32 (n, d) matrix per field, in order; an
        optional field's missing vectors are NaN rows."""
        if not docs:
            return {}
        out = {}
        for name, spec in self.fields.items():
            if not spec.optional:
                out[name] = np.stack([d.vectors[name] for d in docs]).astype(np.float32,
                                                                            copy=False)
                continue
            m = np.full((len(docs), spec.dim), np.nan, np.float32)
            for i, d in enumerate(docs):
                v = (d.vectors or {}).get(name)
                if v is not None:
                    m[i] = v
            out[name] = m
        return out
