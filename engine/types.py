"""Plain types both sides of the wire need: documents, hits and request limits.

The embedded engine and the remote client share these, so the client can import them without
loading storage, encoders or pyarrow.

The limits: every cap on what one request may ask for, in one place (README's "Limits"
table). A request over a cap is refused before any work starts: INVALID_ARGUMENT for a
malformed or oversized input (a text, a name, a filter), RESOURCE_EXHAUSTED for asking the
server to do or hold too much (k, a batch, an index over the memory budget). Messages name
the field and the cap.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

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
MAX_UPSERT_RECORDS = 100_000  # documents in one Upsert stream (held whole: all or nothing)
MAX_UPSERT_BYTES = 1 << 30  # bytes of one Upsert stream
MAX_MESSAGE_BYTES = 64 << 20  # one gRPC message, either way (so one record at most)

# -- collections --------------------------------------------------------------------------
MAX_NAME_CHARS = 128  # a collection's (or a field's) name
MAX_INDEXES = 16  # indexes (representations) of one collection
MAX_FIELDS = 256  # metadata fields of one collection
MAX_SEGMENT_SIZE = 10_000_000  # documents per segment (what one build holds in memory)

# -- index builds -------------------------------------------------------------------------
# What one index's trained parts (centroids, codebooks, rotations) and one segment's index may
# take, checked from the factory string before anything is built: half the machine's memory
# (a 1M x 384 HNSW segment of the ANN benchmark takes ~2 GB), or POLYINDEX_INDEX_MEMORY_MB.
INDEX_MEMORY_BYTES = int(os.environ.get("POLYINDEX_INDEX_MEMORY_MB", "0")) << 20 or max(
    1 << 30, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)

# -- shutdown -----------------------------------------------------------------------------
# SIGTERM: in-flight calls get GRACE_S to finish (then are cancelled), the unsealed write
# buffer SEAL_S to be sealed (else it stays in the write-ahead log, replayed on restart);
# ``polyindex serve`` exits within GRACE_S + SEAL_S + 5 s (``service.shutdown``).
SHUTDOWN_GRACE_S = float(os.environ.get("POLYINDEX_SHUTDOWN_GRACE_S", "5"))
SHUTDOWN_SEAL_S = float(os.environ.get("POLYINDEX_SHUTDOWN_SEAL_S", "10"))


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
