"""Validation of one document record (a JSON object, a CSV or Parquet row, a dict given to
``add()``), shared by every source, the embedded engine and the remote client."""
from __future__ import annotations

import math
import re
from typing import Any

from polyindex.errors import InputError
from polyindex.ingest.tokens import as_tokens
from polyindex.ingest.vectors import VECTOR_KEYS, vectors_of_record
from polyindex.types import MAX_ID_CHARS, Document

_CONTROL = re.compile(r"[\x00-\x1f]")


def kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def jsonable(value: Any) -> Any:
    """Parquet cells can hold dates, decimals and bytes; metadata must stay JSON-compatible."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(kv, tuple) and len(kv) == 2 for kv in value):
            return {str(k): jsonable(v) for k, v in value}  # an Arrow map comes as (key, value) pairs
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return value.isoformat() if hasattr(value, "isoformat") else str(value)  # dates, Decimal, ...


def _check_id(raw_id: Any) -> str:
    """The id as a string, or ValueError saying what is wrong with it."""
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        return str(raw_id)
    if not isinstance(raw_id, str):
        raise ValueError("missing id (expected '_id' or 'id')" if raw_id is None
                         else f"id must be a string or an integer, got {kind_of(raw_id)}")
    if not raw_id:
        raise ValueError("empty id")
    if len(raw_id) > MAX_ID_CHARS:
        raise ValueError(f"id is {len(raw_id)} characters long (max {MAX_ID_CHARS})")
    if _CONTROL.search(raw_id):
        raise ValueError("id contains control characters")
    return raw_id


# Python types a declared field accepts (bool is an int to Python, never to a field)
_ACCEPTS = {"string": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def typed_value(value: Any, ftype: str, from_text: bool = False) -> Any:
    """A declared field's value checked against its type; ``from_text`` (CSV cells, where
    every value is a string) parses the text first, an empty cell being no value. Raises
    ValueError saying what is wrong."""
    if from_text and isinstance(value, str) and ftype != "string":
        text = value.strip()
        try:
            if not text:
                return None
            if ftype == "int":
                return int(text)
            if ftype == "float":
                number = float(text)
                if math.isfinite(number):
                    return number
            elif text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
        except ValueError:
            pass
        want = {"int": "an integer", "float": "a finite number", "bool": "true or false"}[ftype]
        raise ValueError(f"{value!r} is not {want} (declared {ftype})"[:200])
    if value is not None and (not isinstance(value, _ACCEPTS[ftype])
                              or (ftype != "bool" and isinstance(value, bool))):
        raise ValueError(f"must be {ftype}, got {kind_of(value)} {value!r}"[:200])
    return value


def document_from_record(rec: dict[str, Any], source: str | None = None,
                         line: int | None = None, fields: dict[str, str] | None = None,
                         from_text: bool = False, vectors=None) -> Document | InputError:
    """Validate one parsed record (JSON object, CSV/Parquet row, or a dict given to add()).

    ``fields`` (the collection's declared fields) are type-checked here, where the record's
    file and line are known; ``from_text`` parses them from text first (CSV).
    ``vectors`` (a ``VectorSpec``) checks the record's vectors against a collection's vector
    fields; without it they are only checked to be well-formed. A record with vectors may
    leave out its text."""
    id_field = "_id" if "_id" in rec else "id"
    try:
        doc_id = _check_id(rec.get(id_field))
    except ValueError as e:
        return InputError(str(e), source=source, line=line, field=id_field)
    vecs, vfield, verr = vectors_of_record(rec) if _has_vectors(rec) else (None, None, None)
    if verr is not None:
        return InputError(verr, source=source, line=line, field=vfield, doc_id=doc_id)
    toks = rec.get("tokens")
    if toks is not None:
        try:
            toks = as_tokens(toks)
        except ValueError as e:
            return InputError(str(e), source=source, line=line, field="tokens", doc_id=doc_id)
    if vectors is not None:
        err = vectors.check(vecs, source=source, line=line, doc_id=doc_id) or \
            vectors.check_tokens(toks, source=source, line=line, doc_id=doc_id)
        if err is not None:
            return err
    text, title = rec.get("text"), rec.get("title")
    title = "" if title is None else title
    if text is None and (vecs is not None or toks is not None):
        text = ""
    bad = None
    if text is None:
        bad = ("missing text", "text")
    elif not isinstance(text, str):
        bad = (f"field 'text' must be a string, got {kind_of(text)}", "text")
    elif not isinstance(title, str):
        bad = (f"field 'title' must be a string, got {kind_of(title)}", "title")
    if bad:
        return InputError(bad[0], source=source, line=line, field=bad[1], doc_id=doc_id)
    metadata: dict[str, Any] = {}
    nested = rec.get("metadata")
    if isinstance(nested, dict):  # BEIR keeps extra fields in "metadata": flatten them
        metadata.update(nested)
    for key, value in rec.items():
        if key not in (id_field, "text", "title", *VECTOR_KEYS) and \
                not (key == "metadata" and isinstance(value, dict)):
            metadata[key] = value  # top-level keys win over same-named nested ones
    for name, ftype in (fields or {}).items():
        if name in metadata:
            try:
                value = typed_value(metadata[name], ftype, from_text)
            except ValueError as e:
                return InputError(str(e), source=source, line=line, field=name, doc_id=doc_id)
            if value is None:
                metadata.pop(name)  # an empty CSV cell: the document has no value there
            else:
                metadata[name] = value
    return Document(doc_id, title, text, metadata, vecs, toks)


def _has_vectors(rec: dict[str, Any]) -> bool:
    return rec.get("vector") is not None or rec.get("vectors") is not None
