"""Query requests as the collection API takes them: texts and/or vectors (one unnamed vector,
one named by ``using``, or a dict of named ones) turned into checked ``Query`` objects, and
the profile a query by named vectors runs when none is given."""
from __future__ import annotations

import numpy as np

from polyindex.errors import InvalidArgument, did_you_mean
from polyindex.index.protocol import Query
from polyindex.types import MAX_VECTOR_NORM


def default_vector_profile(queries: list[Query], using: str | None, kinds: dict):
    """The profile a query by named vectors runs when none is given: the field's own index,
    or reciprocal rank fusion over the fields given; a query by tokens alone, the
    multivector index. None: the collection's default."""
    fields = set(queries[0].vectors)
    if "tokens" in queries[0].extra and not fields and queries[0].vector is None \
            and queries[0].text is None and "multivector" in kinds:
        return "multivector"
    if using is not None and using != "dense":
        fields = {using}
    if not fields:
        return None
    if queries[0].vector is not None:
        fields.add("dense")
    names = []
    for f in sorted(fields):
        name = "dense" if f == "dense" else f"dense@{f}"
        if name not in kinds:
            have = sorted(k.field for k in kinds.values() if k.kind == "dense")
            raise InvalidArgument(f"no vector field {f!r} in this collection"
                                  f"{did_you_mean(f, have)} "
                                  f"(its vector fields: {', '.join(have) or 'none'})")
        names.append(name)
    if len(names) == 1:
        return names[0]
    return {"retrieve": [{"index": n, "k": 100} for n in names], "fuse": {"method": "rrf", "k": 60}}


def query_vector(value, i: int, field: str) -> np.ndarray:
    try:
        vec = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidArgument(f"query {i}: vector must be a list of numbers") from None
    if vec.ndim != 1 or not vec.size:
        raise InvalidArgument(f"query {i}: vector must be a non-empty list of numbers")
    if not np.isfinite(vec).all():
        raise InvalidArgument(f"query {i}: vector has NaN or infinite values")
    norm = float(np.linalg.norm(vec.astype(np.float64)))
    if norm > MAX_VECTOR_NORM:
        raise InvalidArgument(f"query {i}: vector norm {norm:.3g} is absurd (max "
                              f"{MAX_VECTOR_NORM:.0e}); scores would overflow")
    return vec


def query_tokens(value, i: int) -> np.ndarray:
    """A query's token matrix (n_tokens, d), checked as documents' are."""
    from polyindex.ingest.tokens import as_tokens
    try:
        return as_tokens(value)
    except ValueError as e:
        raise InvalidArgument(f"query {i}: {e}") from None


def make_queries(texts, vectors, using: str | None = None, tokens=None) -> list[Query]:
    """``tokens``: per query, a token matrix for a ``multivector:source=user`` index."""
    if texts is None and vectors is None and tokens is None:
        raise InvalidArgument("a query needs text or a vector (or tokens)")
    n = len(texts) if texts is not None else len(vectors) if vectors is not None else len(tokens)
    if texts is not None and vectors is not None and len(vectors) != n:
        raise InvalidArgument(f"{n} query texts but {len(vectors)} vectors")
    if tokens is not None and len(tokens) != n:
        raise InvalidArgument(f"{n} queries but {len(tokens)} token matrices")
    out = []
    for i in range(n):
        text = None if texts is None else texts[i]
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise InvalidArgument(f"query {i}: text must be a non-empty string")
        vec, named = None, {}
        if vectors is not None:
            if vectors[i] is None:
                raise InvalidArgument(f"query {i}: vector is missing")
            if isinstance(vectors[i], dict):
                if using is not None:
                    raise InvalidArgument("give using= with one vector, not with a dict of them")
                named = {str(f): query_vector(v, i, f) for f, v in vectors[i].items()}
                vec = named.pop("dense", None)
            elif using is not None and using != "dense":
                named = {using: query_vector(vectors[i], i, using)}
            else:
                vec = query_vector(vectors[i], i, "dense")
        extra = {}
        if tokens is not None:
            if tokens[i] is None:
                raise InvalidArgument(f"query {i}: tokens are missing")
            extra["tokens"] = query_tokens(tokens[i], i)
        out.append(Query(text=text, vector=vec, vectors=named, extra=extra))
    if not out:
        raise InvalidArgument("no queries given")
    return out
