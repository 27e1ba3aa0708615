"""The built-in index kinds, listed, and their creation from a factory string.

The list is explicit rather than filled by the kinds registering themselves on import: the
kinds import ``protocol``, so a registry there that imported them back made an import circle
(issue 42). The kinds are imported on first use, so importing polyindex stays cheap.
"""
from __future__ import annotations

import importlib

from polyindex.errors import InvalidArgument
from polyindex.index.protocol import IndexKind

# Kind name -> (module, class). ``from_factory`` imports only the kind it is asked for: a
# lexical-only collection's cold CLI query never imports faiss (issue 38).
_BUILTIN = {
    "dense": ("polyindex.index.dense.kind", "DenseKind"),
    "lexical": ("polyindex.index.lexical.kind", "LexicalKind"),
    "multivector": ("polyindex.index.multivector.kind", "MultivectorKind"),
    "sparse": ("polyindex.index.sparse.kind", "SparseKind"),
    "tree": ("polyindex.index.tree.kind", "TreeKind"),
}


def kind_class(name: str) -> type[IndexKind] | None:
    """The class of the built-in kind ``name`` (imported now), or None when there is none."""
    where = _BUILTIN.get(name)
    if where is None:
        return None
    return getattr(importlib.import_module(where[0]), where[1])


def builtin_kinds() -> dict[str, type[IndexKind]]:
    """Kind name -> its class, for every built-in kind (imports them all)."""
    return {name: kind_class(name) for name in _BUILTIN}


def known_kinds() -> list[str]:
    return sorted(_BUILTIN)


def from_factory(factory: str) -> IndexKind:
    """Create an index kind from a factory string such as ``"dense:HNSW32,Flat"``."""
    if not isinstance(factory, str) or not factory.strip():
        raise InvalidArgument(f"index factory string must be a non-empty string, got {factory!r}")
    head, _, body = factory.strip().partition(":")
    kind, at, field_name = head.strip().partition("@")
    cls = kind_class(kind.strip())
    if cls is None:
        raise InvalidArgument(f"unknown index kind {kind!r} in factory string {factory!r}; "
                              f"known kinds: {', '.join(known_kinds())}")
    if at:
        if not cls.named_fields:
            raise InvalidArgument(f"index kind {kind!r} has no named fields ({factory!r}); "
                                  "only dense takes '@FIELD'")
        return cls(body.strip(), field=field_name.strip())
    return cls(body.strip())
