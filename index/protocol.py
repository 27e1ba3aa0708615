"""The one index protocol every index kind implements (the FAISS ``Index`` idea, in two levels).

A *kind* (``IndexKind``) is the collection-level object for one representation: created from
a factory string, it may ``train`` on a sample (IVF centroids, codebooks, ...), it ``build``s a
segment's files, ``open``s them as a ``SegmentIndex``, and ``prepare``s a query once per query
(query-wide statistics such as IDF or a query embedding) against a snapshot. A *segment index*
answers ``search`` and ``score`` for one immutable segment, on segment-local row ids.

Shapes: ``search`` returns ``(scores, row_ids)`` of shape ``(nq, k)``, float32 and int64, padded
with ``-inf`` / ``-1``; higher scores are better. ``allow`` is a boolean mask over the
segment's rows (live and passing the filter) or None for all rows.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from polyindex.errors import Corrupt, InvalidArgument


def parse_options(text: str, *, where: str) -> dict[str, str]:
    """Parse ``"a=1,b=x"`` (search params or factory options) into a dict of strings."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"{where}: expected key=value, got {part!r}")
        out[key.strip()] = value.strip()
    return out


def option(opts: dict[str, str], key: str, cast, default, *, where: str):
    """Read one typed option, with a clear error on a bad value."""
    if key not in opts:
        return default
    try:
        return cast(opts[key])
    except ValueError:
        raise InvalidArgument(f"{where}: option {key}={opts[key]!r} is not a valid {cast.__name__}") from None


@dataclass
class DocTokens:
    """One document's per-token (or per-patch) embeddings from a token encoder."""

    vectors: np.ndarray  # (n_tokens, d) float16/float32, L2-normalized
    special: np.ndarray | None = None  # (n_tokens,) bool: [CLS]/[SEP]-like tokens
    salience: np.ndarray | None = None  # (n_tokens,) float32, e.g. attention received
    token_ids: np.ndarray | None = None  # (n_tokens,) int32 vocabulary ids (IDF fallback)


@dataclass
class BuildBatch:
    """What a kind gets to build one segment: rows in segment order."""

    ids: Sequence[str]
    titles: Sequence[str]
    texts: Sequence[str]
    embeddings: np.ndarray | None = None  # (n, d) float32, L2-normalized, when the collection encodes
    tokens: Sequence[DocTokens] | None = None  # per row, when a kind ``needs_tokens``
    # user-supplied vectors by field name ("dense" is the unnamed field, also ``embeddings``)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    # live rows of the collection this segment joins, besides its own (0: not known); a
    # kind may size its index by the collection rather than the segment (dense "auto")
    collection_rows: int = 0
    # rows kept out of the costly representations (``--prune-quality``): bool (n,), or None.
    # Their embeddings are zero rows (never encoded) and their tokens a zero placeholder; a
    # costly kind may store anything for them (searches never see them: dense marks them
    # absent, the query pipeline folds the rest out of the allow masks).
    pruned: np.ndarray | None = None


@dataclass
class Query:
    """One query as the user gave it; kinds read what they need."""

    text: str | None = None
    vector: np.ndarray | None = None  # (d,) float32 query embedding (the unnamed field)
    extra: dict[str, Any] = field(default_factory=dict)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # named fields' query vectors


class SegmentDocs(Protocol):
    """A segment's stored documents, handed to ``IndexKind.open`` by the storage layer (one
    memory map per segment, shared by every kind: kinds never open ``docs.arrow`` themselves)."""

    n_rows: int

    def embeddings(self) -> np.ndarray | None:
        """(n_rows, d) float32 stored document embeddings (memory-mapped), None if not stored."""

    def column(self, name: str) -> list:
        """One stored column (``title``, ``text``, ...) as Python values, in row order."""

    def vector_column(self, name: str) -> np.ndarray | None:
        """(n_rows, d) float32 view of a stored vector column (``vector.<field>``), or None."""


class TokenEncoder(Protocol):
    """Per-token embeddings for kinds that encode text themselves (multivector)."""

    def encode_documents(self, texts: Sequence[str], *, salience: bool = False,
                         on_batch=None) -> tuple[np.ndarray, list[DocTokens]]: ...

    def encode_queries(self, texts: Sequence[str]) -> list[DocTokens]: ...


_IMPLEMENTS: dict[tuple[type, type], bool] = {}


def implements(obj: Any, proto: type) -> bool:
    """``isinstance(obj, proto)`` for the runtime-checkable protocols below, remembered per
    class: a Protocol isinstance walks every attribute (~10 us), and these checks are on every
    query's path. (The protocols name methods, which a class has or lacks as a whole.)"""
    key = (type(obj), proto)
    got = _IMPLEMENTS.get(key)
    if got is None:
        got = _IMPLEMENTS[key] = isinstance(obj, proto)
    return got


# -- optional capabilities of a segment index, declared rather than probed ---------------

@runtime_checkable
class Explains(Protocol):
    """Explains hits itself (e.g. the tree's root-to-leaf path), shown under ``explain``."""

    def explain(self, prepared: Any, row_ids: Sequence[int]) -> list[dict]: ...


@runtime_checkable
class StoredVectors(Protocol):
    """Gives the stored float32 vectors of rows (the dense rerank features use them)."""

    def vectors(self, rows: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class TermStatistics(Protocol):
    """A lexical index's vocabulary, analyzer and forward index, for rerank statistics.

    ``term_id(term)`` is the segment-local id or None, ``terms()`` the vocabulary in id order;
    ``forward`` is (row offsets, title lengths, term ids) or None when the segment was built
    without one; ``analyzer`` is the analyzer the index was built with."""

    analyzer: Any
    forward: tuple | None
    n_terms: int

    def terms(self) -> list[str]: ...

    def term_id(self, term: str) -> int | None: ...


@runtime_checkable
class Merges(Protocol):
    """An index kind that merges segments from their own stored data instead of building
    from the documents (e.g. multivector copies token codes: no re-encoding). ``parts`` are
    (segment index, rows kept) in merged order; ``batch`` is the merged rows' documents and
    vectors, for whatever the kind rebuilds. Returns the build info, as ``build``."""

    def merge(self, parts: Sequence[tuple["SegmentIndex", np.ndarray]], batch: BuildBatch,
              folder: Path) -> dict: ...


@runtime_checkable
class SearchesSnapshot(Protocol):
    """A kind whose search budget is collection-wide (sparse ``rescore``, multivector
    ``ndocs``, tree ``budget``): the query pipeline hands it every segment of the snapshot at
    once instead of calling ``SegmentIndex.search`` per segment, so the result does not depend
    on how the documents fell into segments. ``bases`` are the segments' first global keys
    (``len(segments) + 1`` entries, the last one the total); returns ``(scores, keys)`` of
    shape (nq, k), global keys, best first (ties: lower key), ``-inf``/``-1`` padded."""

    def search_snapshot(self, prepared: Any, segments: Sequence["SegmentIndex"],
                        bases: np.ndarray, k: int, params: dict[str, str],
                        allow: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class PlansDirectly(Protocol):
    """A kind that can answer a plain one-stage query itself, without the general pipeline
    (the dense kind's vector lane). ``direct_plan`` is asked once per snapshot and stage
    (``segments``: the stage's segment indexes, in snapshot order) and returns a plan, or
    None when it cannot take that stage. A plan's ``search(snapshot, vector, k)`` and
    ``search_batch(snapshot, vectors, k)`` return the hits (a list of ``Hit``, or one list
    per vector), and ``rank(snapshot, vector, k)`` the same as a ``Ranking`` (ids and
    scores, no ``Hit`` objects), bit for bit what the general path gives, or None to hand a
    query to it (which then says what is wrong). ``query/vector_lane`` decides which calls may ask."""

    def direct_plan(self, snapshot: Any, segments: Sequence["SegmentIndex"],
                    params: dict[str, str]) -> Any: ...


class SegmentIndex(ABC):
    """One kind's index over one sealed segment."""

    n_rows: int

    @abstractmethod
    def search(self, prepared: Any, k: int, params: dict[str, str],
               allow: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows of this segment for a prepared query: ``(scores, row_ids)``, shape (nq, k)."""

    @abstractmethod
    def score(self, prepared: Any, row_ids: np.ndarray) -> np.ndarray:
        """Scores of the given rows (shape (nq, len(row_ids)), NaN where not scorable)."""

    def prepare_live(self, live: np.ndarray, before: np.ndarray | None = None,
                     hidden: np.ndarray | None = None) -> None:
        """Work out, off the query path, what searches under a new frozen live mask will
        need (a writer calls it for the masks its writes make). ``before`` is the mask it
        replaces (None: every row live) and ``hidden`` the rows live under ``before`` but
        not under ``live``, from which an index may update what it kept for ``before``
        instead of counting again. Nothing by default."""


class IndexKind(ABC):
    """Collection-level index kind (one per representation of a collection)."""

    kind: ClassVar[str]
    # Kinds that may be declared several times under a field name (``dense@image``).
    named_fields: ClassVar[bool] = False
    needs_embeddings: ClassVar[bool] = False
    # Per-token embeddings (``BuildBatch.tokens``), from the same forward pass as the dense
    # embedding; kinds that set it also encode texts themselves when a batch has none.
    needs_tokens: ClassVar[bool] = False
    # Scores that often tie (BM25 over integer counts) from an exact per-segment top k: the
    # pipeline asks each segment for more rows than k (``ties.ask_for``) to see a run of
    # equal scores straddling the k-th place, asks again for more until it holds the whole
    # run, and keeps its members with the smallest ids (``ties.cut_ties``). Kinds of float
    # similarities (equal only for equal vectors) keep their lists as searched.
    completes_ties: ClassVar[bool] = False

    def __init__(self, body: str):
        self.body = body
        self.device = "cpu"
        self._token_encoder: Callable[[], TokenEncoder] | None = None

    @property
    def name(self) -> str:
        """The index name a collection keys this kind by (profiles, manifest, artifacts):
        the kind itself, or ``kind@field`` for a named field."""
        return self.kind

    @property
    def artifact_name(self) -> str:
        """Its folder under ``artifacts/`` and key in the manifest: a plain name (``dense.image``
        for ``dense@image``; the manifest refuses names with other characters)."""
        return self.name.replace("@", ".")

    def attach(self, *, device: str = "cpu",
               token_encoder: Callable[[], TokenEncoder] | None = None) -> None:
        """What the collection gives a kind: its placement and, for kinds that encode
        (``needs_tokens``), a factory of the collection's token encoder (called lazily)."""
        self.device = device
        self._token_encoder = token_encoder

    @property
    def wants_salience(self) -> bool:
        """Whether the writer should compute token salience for this kind's tokens."""
        return False

    def describe(self) -> str:
        """The factory string that recreates this kind."""
        return f"{self.kind}:{self.body}" if self.body else self.kind

    # -- collection-level training -------------------------------------------------------
    def needs_training(self) -> bool:
        return False

    def train(self, sample: BuildBatch) -> None:
        """Learn collection-level artifacts from a sample; kinds that learn nothing skip it."""

    def save_artifacts(self, folder: Path) -> list[str]:
        """Write trained artifacts into ``folder``; return the file names written."""
        return []

    def load_artifacts(self, folder: Path) -> None:
        """Load what ``save_artifacts`` wrote."""

    # -- segments ------------------------------------------------------------------------
    @abstractmethod
    def build(self, batch: BuildBatch, folder: Path) -> dict:
        """Write this kind's files for one segment into ``folder``; return its manifest info."""

    @abstractmethod
    def open(self, folder: Path, info: dict, docs: SegmentDocs | None = None) -> SegmentIndex:
        """Open (memory-map) a built segment; ``docs`` is the segment's stored documents
        (None where a caller has only the kind's own files, e.g. a unit test)."""

    # -- queries -------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, queries: Sequence[Query], segments: Sequence[SegmentIndex],
                live: Sequence[np.ndarray | None], params: dict[str, str], cache: dict) -> Any:
        """Compute query-wide state once per query batch (IDF, embeddings) for a snapshot.

        ``segments`` and ``live`` (tombstone masks, None = all live) describe the snapshot, so
        collection-wide statistics can be computed here and do not depend on segmentation.
        ``cache`` is a dict owned by the snapshot (empty when it opens, dropped with it): the
        place to keep collection-wide statistics between queries of the same snapshot.
        """


def check_format(folder: Path, info: dict, kind: str, supported: int) -> None:
    """Refuse a segment index written by a newer version (its build info's ``format``)."""
    if info.get("format", supported) > supported:
        raise Corrupt(f"{folder}: {kind} index format {info['format']} is newer than this "
                      f"version reads ({supported})")


def empty_result(nq: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((nq, k), -np.inf, dtype=np.float32), np.full((nq, k), -1, dtype=np.int64)


def top_keys(scores: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` of each row of (nq, n) ``scores``/``keys`` by (score desc, key asc); padding
    (key -1) last. Shape (nq, k), ``-inf``/``-1`` padded."""
    nq = scores.shape[0]
    if scores.shape[1] < k:
        pad = k - scores.shape[1]
        scores = np.concatenate([scores, np.full((nq, pad), -np.inf, np.float32)], axis=1)
        keys = np.concatenate([keys, np.full((nq, pad), -1, np.int64)], axis=1)
    scores = np.where(keys >= 0, scores, -np.inf).astype(np.float32, copy=False)
    order = np.lexsort((np.where(keys >= 0, keys, np.iinfo(np.int64).max), -scores), axis=-1)
    order = order[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(keys, order, 1)


def merge_segments(results: Sequence[tuple[np.ndarray, np.ndarray]], bases: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-segment ``(scores, rows)`` (segment-local rows) -> the global top ``k`` keys
    (``bases[i] + row``) by (score desc, key asc)."""
    scores = np.concatenate([s for s, _ in results], axis=1)
    keys = np.concatenate([np.where(r >= 0, r + int(b), -1) for (_, r), b in zip(results, bases)],
                          axis=1)
    return top_keys(scores, keys, k)

