"""Plain types both sides of the wire need: documents, hits and request limits.

The embedded engine and the remote client share these, so the client can import them without
loading storage, encoders or pyarrow.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_K = 10_000  # the most hits one query may ask for
# Vectors above this L2 norm are refused: float32 inner products of two such vectors would
# overflow to inf (3.4e38), and no embedding model produces them.
MAX_VECTOR_NORM = 1e15


@dataclass(slots=True)
class Document:
    id: str
    title: str
    text: str
    metadata: dict[str, Any]
    # user-supplied vectors by field ("dense": the unnamed field), float32 numpy arrays
    vectors: dict[str, Any] | None = None
    # a user token matrix (n_tokens, d) for a ``multivector:source=user`` index
    tokens: Any = None


def document_text(title: str, text: str) -> str:
    """What a document embedding encodes (BEIR convention: title, a space, the text)."""
    return f"{title} {text}".strip() if title else text


@dataclass(slots=True)
class Hit:
    id: str
    score: float
    rank: int
    title: str | None = None
    text: str | None = None
    explain: dict[str, Any] | None = field(default=None, repr=False)
    metadata: dict[str, Any] | None = None  # with_metadata only: the stored metadata


class HitLists(list):
    """Per query, its hits (a list of lists of ``Hit``); ``unavailable_shards``: the shards of a
    sharded collection left out of a partial answer (``allow_partial``), empty otherwise."""

    unavailable_shards: tuple[int, ...] = ()
