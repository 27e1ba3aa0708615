"""Plain types both sides of the wire need: documents, hits, request limits, and the one
collection interface.

The embedded engine and the remote client share these, so the client can import them without
loading storage, encoders or pyarrow.

The limits: every cap on what one request may ask for, in one place (README's "Limits"
table). A request over a cap is refused before any work starts: INVALID_ARGUMENT for a
malformed or oversized input (a text, a name, a filter), RESOURCE_EXHAUSTED for asking the
server to do or hold too much (k, a batch, an index over the memory budget). Messages name
the field and the cap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

from polyindex.errors import InvalidArgument

MAX_K = 10_000  # the most hits one query may ask for
# Vectors above this L2 norm are refused: float32 inner products of two such vectors would
# overflow to inf (3.4e38), and no embedding model produces them.
MAX_VECTOR_NORM = 1e15

# -- queries ------------------------------------------------------------------------------
MAX_BATCH = 1024  # queries in one Query call
MAX_TEXT_CHARS = 8192  # characters of one query text
MAX_VECTOR_DIMS = 65_536  # dimensions of one vector (a field's declared dim too)
MAX_FILTER_NODES = 1024  # JSON nodes (keys, items, values) of one filter or inline profile
MAX_FILTER_DEPTH = 32  # JSON nesting levels of one filter (or inline profile)

# -- reads and writes ---------------------------------------------------------------------
MAX_ID_CHARS = 1024  # a document id
MAX_TOKENS = 65_536  # tokens of one document's (or query's) token matrix (ColPali pages ~1,030)
MAX_IDS = 10_000  # ids in one Get or Delete
MAX_SCROLL = 10_000  # documents in one scroll page
MAX_UPSERT_RECORDS = 100_000  # documents in one Upsert stream (held whole: all or nothing)
MAX_UPSERT_BYTES = 1 << 30  # bytes of one Upsert stream
MAX_MESSAGE_BYTES = 64 << 20  # one gRPC message, either way (so one record at most)

# -- collections --------------------------------------------------------------------------
MAX_NAME_CHARS = 128  # a collection's (or a field's) name
MAX_INDEXES = 16  # indexes (representations) of one collection
MAX_FIELDS = 256  # metadata fields of one collection
MAX_SEGMENT_SIZE = 10_000_000  # documents per segment (what one build holds in memory)

# The index memory budget and SIGTERM's bounds are process settings: ``config``.


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


@dataclass(slots=True)  # not frozen: a frozen init costs ~3x (object.__setattr__)
class Ranking:
    """A query's answer as arrays (``query_ids``): the ids best first and their scores (a
    float64 numpy array, each equal to the ``Hit.score`` ``query`` gives), for a caller that
    needs only the ranking (an evaluation loop, a retriever that fetches text elsewhere). It
    makes no per-hit object: 100 ``Hit`` objects cost about as much as a short lexical
    query's scoring."""
    ids: list[str]
    scores: Any

    def __len__(self) -> int:
        return len(self.ids)

    def hits(self) -> list[Hit]:
        """The same answer as ``Hit`` objects (ranks from 1)."""
        return list(map(Hit, self.ids, self.scores.tolist(), range(1, len(self.ids) + 1)))

    @classmethod
    def of(cls, hits: Sequence[Hit]) -> "Ranking":
        import numpy as np  # here: the client imports this module without numpy's cost
        return cls([h.id for h in hits], np.array([h.score for h in hits], np.float64))


@dataclass(slots=True)
class Page:
    """One page of ``scroll``: documents in scroll order and the cursor of the next page
    (None: this was the last)."""
    documents: list[Document]
    cursor: str | None


def check_fields(fields) -> list[str] | None:
    """A ``fields=`` include list (metadata names a hit or document carries): None (all) or
    a list of strings."""
    if fields is None:
        return None
    if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
        raise InvalidArgument("fields must be a list of metadata field names (strings)")
    return list(fields)


def select_fields(metadata: dict | None, fields: list[str] | None) -> dict | None:
    """``metadata`` cut to ``fields`` (None: all of it); names it lacks are left out."""
    if fields is None or metadata is None:
        return metadata
    return {f: metadata[f] for f in fields if f in metadata}


class HitLists(list):
    """Per query, its hits (a list of lists of ``Hit``); ``unavailable_shards``: the shards of a
    sharded collection left out of a partial answer (``allow_partial``), empty otherwise."""

    unavailable_shards: tuple[int, ...] = ()


class CollectionAPI(Protocol):
    """What a collection is to its user, wherever it lives: ``Collection`` (embedded),
    ``client.remote.RemoteCollection`` (over gRPC) and ``distributed.router.ShardedCollection``
    (sharded) implement it with these signatures (an implementation may add keyword-only
    parameters with defaults, e.g. ``timeout``, ``allow_partial``); tests/test_layout.py
    checks the signatures and tests/test_client_parity.py runs one suite against all three."""

    name: str

    def add(self, docs: Iterable[Any]) -> int: ...

    def delete(self, ids: Sequence[str]) -> int: ...

    def delete_where(self, filter: dict) -> int: ...

    def get(self, ids: Sequence[str], *, with_vectors: bool = False,
            fields: Sequence[str] | None = None) -> list[Document | None]: ...

    def count(self, filter: dict | None = None) -> int: ...

    def scroll(self, *, filter: dict | None = None, limit: int = 100, cursor: str | None = None,
               fields: Sequence[str] | None = None, with_vectors: bool = False) -> Page: ...

    def info(self) -> dict: ...

    def query(self, text: str | None = None, *, vector=None, using: str | None = None,
              tokens=None, k: int = 10, profile=None, filter: dict | None = None,
              explain: bool = False, with_text: bool = False,
              with_metadata: bool | None = None, fields: Sequence[str] | None = None
              ) -> list[Hit]: ...

    def query_batch(self, texts: Sequence[str] | None = None, *, vectors=None,
                    using: str | None = None, tokens=None, k: int = 10, profile=None,
                    filter: dict | None = None, explain: bool = False, with_text: bool = False,
                    with_metadata: bool | None = None,
                    fields: Sequence[str] | None = None) -> list[list[Hit]]: ...

    # ``query``'s ids and scores only, as arrays (no ``Hit`` objects)
    def query_ids(self, text: str | None = None, *, vector=None, using: str | None = None,
                  tokens=None, k: int = 10, profile=None,
                  filter: dict | None = None) -> Ranking: ...

    # A snapshot holding every write acknowledged before the call (issue 41): embedded, a
    # folder path; remote, a name under the server's ``--snapshot-root``; sharded: refused
    # (FailedPrecondition).
    def snapshot(self, path: str) -> dict: ...

    # Learn an encoder from the collection's texts and re-encode it (``revert``: back to the
    # previous encoder); a report. Sharded: refused (FailedPrecondition).
    def adapt(self, *, revert: bool = False, recipe: dict | None = None) -> dict: ...


class EngineAPI(Protocol):
    """The collections of a data directory or a server: ``Engine``, ``client.remote.Client``
    and ``distributed.serving.ShardedEngine`` (checked like ``CollectionAPI``)."""

    def create_collection(self, name: str, indexes: Sequence[str] = ..., *,
                          model: str | None = ..., dtype: str = "auto",
                          segment_size: int = 50_000, fields: dict[str, str] | None = None,
                          profiles: dict[str, dict] | None = None,
                          exist_ok: bool = False) -> CollectionAPI: ...

    def collection(self, name: str) -> CollectionAPI: ...

    def drop_collection(self, name: str) -> None: ...

    def list_collections(self) -> list[str]: ...

    def close(self) -> None: ...

