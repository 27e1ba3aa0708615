"""The built-in index kinds, listed, and their creation from a factory string.

The list is explicit rather than filled by the kinds registering themselves on import: the
kinds import ``protocol``, so a registry there that imported them back made an import circle
(issue 42). The kinds are imported on first use, so importing polyindex stays cheap.
"""
from __future__ import annotations

from polyindex.errors import InvalidArgument
from polyindex.index.protocol import IndexKind

_KINDS: dict[str, type[IndexKind]] | None = None


def builtin_kinds() -> dict[str, type[IndexKind]]:
    """Kind name -> its class, for every built-in kind."""
    global _KINDS
    if _KINDS is None:  # made whole, then published: a thread never sees half of it
        from polyindex.index.dense.kind import DenseKind
        from polyindex.index.lexical.kind import LexicalKind
        from polyindex.index.multivector.kind import MultivectorKind
        from polyindex.index.sparse.kind import SparseKind
        from polyindex.index.tree.kind import TreeKind
        _KINDS = {cls.kind: cls for cls in (DenseKind, LexicalKind, MultivectorKind,
                                            SparseKind, TreeKind)}
    return _KINDS


def known_kinds() -> list[str]:
    return sorted(builtin_kinds())


def from_factory(factory: str) -> IndexKind:
    """Create an index kind from a factory string such as ``"dense:HNSW32,Flat"``."""
    kinds = builtin_kinds()
    if not isinstance(factory, str) or not factory.strip():
        raise InvalidArgument(f"index factory string must be a non-empty string, got {factory!r}")
    head, _, body = factory.strip().partition(":")
    kind, at, field_name = head.strip().partition("@")
    cls = kinds.get(kind.strip())
    if cls is None:
        raise InvalidArgument(f"unknown index kind {kind!r} in factory string {factory!r}; "
                              f"known kinds: {', '.join(sorted(kinds))}")
    if at:
        if not cls.named_fields:
            raise InvalidArgument(f"index kind {kind!r} has no named fields ({factory!r}); "
                                  "only dense takes '@FIELD'")
        return cls(body.strip(), field=field_name.strip())
    return cls(body.strip())
