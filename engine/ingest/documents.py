"""Documents given through the collection API (``add``, ``get``, ``delete``): dicts or
``Document``s checked into ``Document``s, with the errors naming ``add()``, the position and
the id, as a source's records are."""
from __future__ import annotations

from typing import Any

import numpy as np

from polyindex.errors import InputError, InvalidArgument
from polyindex.ingest.records import document_from_record, typed_value
from polyindex.types import Document


def from_user(obj: Any, i: int, spec, fields: dict[str, str] | None = None) -> Document:
    """Accept Documents or dicts ({"id"|"_id", "title"?, "text", "metadata"?, "vector"?,
    "vectors"?, ...}); vectors are checked against the collection's vector fields (``spec``),
    metadata against its declared ``fields``, before anything is written."""
    if isinstance(obj, Document):
        for name, ftype in (fields or {}).items():
            if name in obj.metadata:
                try:
                    typed_value(obj.metadata[name], ftype)
                except ValueError as e:
                    raise InputError(str(e), source="add()", line=i + 1, doc_id=obj.id,
                                     field=name) from None
        if spec or obj.vectors or obj.tokens is not None:
            from polyindex.ingest.tokens import as_tokens
            from polyindex.ingest.vectors import as_vector
            field = "vectors"
            try:
                vecs = {f: as_vector(v, f) for f, v in (obj.vectors or {}).items()}
                field = "tokens"
                toks = None if obj.tokens is None else as_tokens(obj.tokens)
            except ValueError as e:
                raise InputError(str(e), source="add()", line=i + 1, doc_id=obj.id,
                                 field=field) from None
            err = spec.check(vecs, source="add()", line=i + 1, doc_id=obj.id) or \
                spec.check_tokens(toks, source="add()", line=i + 1, doc_id=obj.id)
            if err is not None:
                raise err
            obj = Document(obj.id, obj.title, obj.text, obj.metadata, vecs, toks)
        return obj
    if not isinstance(obj, dict):
        raise InputError(f"document must be a dict, got {type(obj).__name__}", line=i + 1)
    item = document_from_record(obj, source="add()", line=i + 1, fields=fields, vectors=spec)
    if isinstance(item, InputError):
        raise item
    return item




def check_embeddings(embeddings, batch: list[Document], n_given: int) -> np.ndarray:
    """Embeddings given with documents (a router's, encoded elsewhere): (n, d), finite."""
    emb = np.asarray(embeddings, np.float32)
    if len(batch) != n_given:
        raise InvalidArgument("documents given with their embeddings must have unique ids")
    if emb.ndim != 2 or len(emb) != len(batch):
        raise InvalidArgument(f"embeddings must be ({len(batch)}, d), got {emb.shape}")
    if not np.isfinite(emb).all():
        raise InvalidArgument("embeddings have NaN or infinite values")
    return emb


def check_ids(ids) -> list[str]:
    """Ids given to ``get`` and ``delete``: a list of strings."""
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument("ids must be a list of strings")
    return list(ids)
