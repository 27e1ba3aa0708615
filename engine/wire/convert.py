"""Conversions between engine objects (dicts, Document, Hit) and the v1 protobuf messages.

``google.protobuf.Struct`` stores every number as a double, so integral values are turned back
into ints on the way out (exact up to 2**53): a rank profile's ``"k": 100`` must stay an int
for validation, and metadata ints stay ints for typed fields.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from google.protobuf import struct_pb2

from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.types import MAX_MESSAGE_BYTES, Document, Hit  # noqa: F401 - re-exported

_EXACT = 2 ** 53


def to_struct(data: dict) -> struct_pb2.Struct:
    """A JSON-like dict as a Struct; raises ValueError naming what cannot be represented."""
    s = struct_pb2.Struct()
    try:
        s.update(_plain(data))
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"not representable as JSON: {e}") from None
    return s


def _plain(value: Any) -> Any:
    """Struct.update takes only dict/list/str/float/int/bool/None; numpy scalars are common."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return value.item()
    raise TypeError(f"unsupported value of type {type(value).__name__}")


def from_struct(s: struct_pb2.Struct) -> dict:
    return {k: from_value(v) for k, v in s.fields.items()}


def from_value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "struct_value":
        return from_struct(v.struct_value)
    if kind == "list_value":
        return [from_value(x) for x in v.list_value.values]
    if kind == "number_value":
        x = v.number_value
        return int(x) if math.isfinite(x) and x.is_integer() and abs(x) <= _EXACT else x
    if kind in ("string_value", "bool_value"):
        return getattr(v, kind)
    return None  # null_value or unset


def typed_metadata(meta: dict, fields: dict[str, str] | None) -> dict:
    """Undo the one thing a Struct cannot carry: a declared float field's integral value
    (2.0) arrives as the int 2. Undeclared metadata has no type to restore."""
    for name, ftype in (fields or {}).items():
        if ftype == "float" and isinstance(meta.get(name), int) and not isinstance(meta[name], bool):
            meta[name] = float(meta[name])
    return meta


def doc_to_proto(doc: Document) -> pb.Document:
    msg = pb.Document(id=doc.id, title=doc.title, text=doc.text)
    if doc.metadata:
        msg.metadata.CopyFrom(to_struct(doc.metadata))
    for name, v in (doc.vectors or {}).items():
        msg.vectors[name].values.extend(np.asarray(v, np.float32).tolist())
    if doc.tokens is not None:
        put_tokens(msg.tokens, doc.tokens)
    return msg


def put_tokens(msg, tokens) -> None:
    """An (n_tokens, d) matrix into a ``TokenMatrix`` (row-major packed floats + dim)."""
    m = np.asarray(tokens, dtype=np.float32)
    if m.ndim != 2:
        raise ValueError(f"tokens must be an (n_tokens, d) matrix, got shape {m.shape}")
    msg.dim = m.shape[1]
    msg.values.extend(m.reshape(-1).tolist())


def tokens_from_proto(msg) -> np.ndarray:
    """A ``TokenMatrix`` as a float32 (n_tokens, dim) array; ValueError when values do not
    fill whole rows of ``dim``."""
    values = np.array(msg.values, dtype=np.float32)
    if msg.dim == 0 or len(values) % msg.dim:
        raise ValueError(f"a token matrix of {len(values)} values does not split into rows of "
                         f"dim={msg.dim}")
    return values.reshape(-1, msg.dim)


def vectors_from_proto(field) -> dict[str, np.ndarray]:
    """A ``map<string, Vector>`` as float32 arrays (read in C, no per-value Python floats)."""
    return {name: np.array(v.values, dtype=np.float32) for name, v in field.items()}


def doc_from_proto(msg: pb.Document, fields: dict[str, str] | None = None) -> Document:
    meta = from_struct(msg.metadata) if msg.HasField("metadata") else {}
    return Document(msg.id, msg.title, msg.text, typed_metadata(meta, fields),
                    vectors_from_proto(msg.vectors) or None,
                    tokens_from_proto(msg.tokens) if msg.HasField("tokens") else None)


def add_hits(container, hits, *, text: bool = True, metadata: bool = True) -> None:
    """Append hits to a repeated ``Hit`` field in place (no intermediate message copies: this
    is on every query's path); ``text``/``metadata``: whether to send what the hits carry."""
    for hit in hits:
        _fill_hit(container.add(), hit, text, metadata)


def _fill_hit(msg: pb.Hit, hit: Hit, text: bool, metadata: bool) -> None:
    msg.id, msg.score, msg.rank = hit.id, hit.score, hit.rank
    if text and hit.title is not None:
        msg.title = hit.title
    if text and hit.text is not None:
        msg.text = hit.text
    if hit.explain is not None:
        msg.explain.CopyFrom(to_struct(hit.explain))
    if metadata and hit.metadata is not None:
        msg.metadata.CopyFrom(to_struct(hit.metadata))
        if not hit.metadata:
            msg.metadata.SetInParent()  # an empty Struct: "no metadata", not "not asked"


def hit_from_proto(msg: pb.Hit, fields: dict[str, str] | None = None) -> Hit:
    return Hit(msg.id, msg.score, msg.rank,
               msg.title if msg.HasField("title") else None,
               msg.text if msg.HasField("text") else None,
               from_struct(msg.explain) if msg.HasField("explain") else None,
               typed_metadata(from_struct(msg.metadata), fields)
               if msg.HasField("metadata") else None)
