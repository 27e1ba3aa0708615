"""Immutable segments: documents (and their embeddings) as one memory-mapped Arrow IPC file.

A segment folder holds ``docs.arrow`` (id, title, text, metadata_json, declared metadata
fields, an ``embedding`` FixedSizeList<float32> column when the collection encodes, the
documents' quality estimates ``_quality`` and, where some row is pruned, ``_pruned``) and
each index kind's files. It never changes after it is sealed; deletes are tombstone files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from polyindex.errors import Corrupt, InputError
from polyindex.index import arrays
from polyindex.index.postings import readonly
from polyindex.storage import idindex, strings
from polyindex.storage.integrity import check_file, validate_arrow
from polyindex.types import Document

DOCS_FILE = "docs.arrow"
QUALITY_COLUMN = "_quality"  # rerank.doc_quality.COLUMN (storage does not import rerank)
PRUNED_COLUMN = "_pruned"
ARROW_TYPES = {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
PY_TYPES = {"string": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def _field_column(docs: Sequence[Document], name: str, ftype: str) -> pa.Array:
    values = []
    for d in docs:
        v = d.metadata.get(name)
        ok = PY_TYPES[ftype]
        if v is not None and (not isinstance(v, ok) or (ftype != "bool" and isinstance(v, bool))):
            raise InputError(f"field {name!r} must be {ftype}, got {type(v).__name__}",
                             doc_id=d.id, field=name)
        values.append(v)
    return pa.array(values, type=ARROW_TYPES[ftype])


def write_docs(folder: Path, docs: Sequence[Document], fields: dict[str, str],
               embeddings: np.ndarray | None,
               vector_columns: dict[str, np.ndarray] | None = None,
               quality: np.ndarray | None = None, pruned: np.ndarray | None = None) -> None:
    """Write the documents of one segment (in row order) to ``folder/docs.arrow``;
    ``vector_columns`` are more (n, d) float32 columns by name (``vector.<field>``);
    ``quality``: each document's quality estimate (float32 column ``_quality``), ``pruned``:
    rows kept out of the costly representations (bool column ``_pruned``, only when some
    row is: ``rerank.doc_quality``)."""
    cols = {
        "id": pa.array([d.id for d in docs], pa.string()),
        "title": pa.array([d.title for d in docs], pa.string()),
        "text": pa.array([d.text for d in docs], pa.string()),
        "metadata_json": pa.array(
            [json.dumps(d.metadata, ensure_ascii=False) if d.metadata else None for d in docs],
            pa.string()),
    }
    for name, ftype in fields.items():
        cols[name] = _field_column(docs, name, ftype)
    if embeddings is not None:
        n, dim = embeddings.shape
        flat = pa.array(np.ascontiguousarray(embeddings, dtype=np.float32).reshape(-1))
        cols["embedding"] = pa.FixedSizeListArray.from_arrays(flat, dim)
    for name, m in (vector_columns or {}).items():
        flat = pa.array(np.ascontiguousarray(m, dtype=np.float32).reshape(-1))
        cols[name] = pa.FixedSizeListArray.from_arrays(flat, m.shape[1])
    if quality is not None:
        cols[QUALITY_COLUMN] = pa.array(np.asarray(quality, np.float32), pa.float32())
    if pruned is not None and pruned.any():
        cols[PRUNED_COLUMN] = pa.array(np.asarray(pruned, bool), pa.bool_())
    table = pa.table(cols)
    with pa.OSFile(str(folder / DOCS_FILE), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    idindex.write_for(folder, [d.id for d in docs])


class Segment:
    """A sealed segment opened read-only; columns are memory-mapped, zero-copy.

    ``sums`` (the manifest entry's ``files``) are checked before Arrow reads the file;
    ``validate`` (a format-1 entry, no sums) validates it in full instead. Neither: a
    segment this process just built (online buffer, tests)."""

    def __init__(self, folder: Path, seg_id: str, n_rows: int, *,
                 sums: dict[str, dict] | None = None, validate: bool = False):
        self.folder, self.id, self.n_rows = folder, seg_id, n_rows
        path = folder / DOCS_FILE
        if sums is not None:
            if DOCS_FILE not in sums:
                raise Corrupt(f"segment {seg_id}: the manifest lists no {DOCS_FILE} in {folder}")
            check_file(path, sums[DOCS_FILE])
        elif validate:
            validate_arrow(path)
        try:
            self.table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        except (OSError, pa.ArrowException) as e:
            raise Corrupt(f"segment {seg_id}: cannot read {path}: {e}") from e
        if self.table.num_rows != n_rows:
            raise Corrupt(f"segment {seg_id}: {path} has {self.table.num_rows} rows, "
                          f"the manifest says {n_rows}")
        for name in ("id", "title", "text", "metadata_json"):
            if self.table.schema.get_field_index(name) < 0 \
                    or self.table.schema.field(name).type != pa.string():
                raise Corrupt(f"segment {seg_id}: {path} has no string column {name!r}")
        self._sums = sums
        self._emb: np.ndarray | None = None
        self._vec: dict[str, np.ndarray] = {}
        self._id_entries: tuple[np.ndarray, np.ndarray] | None = None
        self._id_buffers = None  # (offsets, data) of the id column, or False: use take
        self._id_ranks: np.ndarray | None = None
        self._quality: np.ndarray | None = None
        self._pruned = None  # None: not read yet; False: no row is pruned

    @property
    def checksummed(self) -> bool:
        """Its files were checked against the manifest's sums before use (format 2)."""
        return self._sums is not None

    @property
    def ids(self) -> np.ndarray:
        """Every id as a numpy object array, built per call (tools and tests; queries use
        ``ids_at``)."""
        return self.table.column("id").to_numpy(zero_copy_only=False)

    def id_buffers(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(offsets int32, UTF-8 bytes uint8) of the id column, zero-copy and read-only, or
        None where it is not one plain string chunk (then ``ids_at`` takes)."""
        if self._id_buffers is None:
            col = self.table.column("id")
            if col.num_chunks == 1 and pa.types.is_string(col.type) and col.null_count == 0:
                arr = col.chunk(0)
                offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:]
                buf = arr.buffers()[2]
                data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
                # memoryviews: indexing one gives a Python int without a numpy scalar
                self._id_buffers = (readonly(offsets), readonly(data), memoryview(offsets),
                                    memoryview(data))
            else:
                self._id_buffers = False
        return self._id_buffers[:2] if self._id_buffers else None

    def id_ranks(self) -> np.ndarray:
        """Each row's place among the segment's ids in code point order (int32, read-only),
        made on first use: one Arrow sort per opened segment (O(n log n) once, 4 bytes a
        row), after which many tied rows of the segment go in id order as integers
        (``ties.order_ties``: a lexical top 1000 tied ~870 rows a query)."""
        if self._id_ranks is None:
            order = pc.sort_indices(self.table.column("id")).to_numpy()
            ranks = np.empty(len(order), np.int32)
            ranks[order] = np.arange(len(order), dtype=np.int32)
            self._id_ranks = readonly(ranks)
        return self._id_ranks

    def ids_at(self, rows: np.ndarray) -> list[str]:
        """The ids of ``rows``, read from the memory-mapped Arrow column: no per-segment
        array of every id as Python strings (~65 bytes a document, resident for good). A
        single-chunk column is sliced through its offsets (a compute ``take`` cost ~18 us a
        query, numpy gathers of the offsets ~4 us, this ~2 us for ten hits); past a few
        rows their bytes are gathered in one numba call and decoded once (``strings``)."""
        self.id_buffers()
        if self._id_buffers is False:
            rows = np.asarray(rows, dtype=np.int64)
            return self.table.column("id").take(pa.array(rows, pa.int64())).to_pylist()
        offsets, data, moff, mdata = self._id_buffers
        if len(rows) > 4:  # many at once: one gather and one decode (``strings``)
            got = strings.take(offsets, data, readonly(np.asarray(rows, np.int64)))
            if got is not None:
                return got
        rows = rows.tolist() if isinstance(rows, np.ndarray) else [int(r) for r in rows]
        return [mdata[moff[r]:moff[r + 1]].tobytes().decode() for r in rows]

    def id_take(self, rows: np.ndarray) -> pa.Array:
        """The ids of ``rows`` as an Arrow string array (a compute ``take``)."""
        got = self.table.column("id").take(pa.array(np.asarray(rows, np.int64)))
        return got.combine_chunks() if isinstance(got, pa.ChunkedArray) else got

    def id_column(self) -> pa.ChunkedArray:
        return self.table.column("id")

    def id_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The id index (sorted id hashes, their rows): the stored file, memory-mapped, or
        for a segment written without one, computed once."""
        if self._id_entries is None:
            path = self.folder / idindex.ID_INDEX_FILE
            if self._sums is not None and idindex.ID_INDEX_FILE in self._sums:
                check_file(path, self._sums[idindex.ID_INDEX_FILE])
                self._id_entries = idindex.read(path, self.n_rows, scan=False)
            elif self._sums is None and path.exists():  # built by this process
                self._id_entries = idindex.read(path, self.n_rows)
            else:
                self._id_entries = idindex.sorted_entries(
                    idindex.hash_ids(self.id_column().to_pylist()), np.arange(self.n_rows))
        return self._id_entries

    def lookup(self, ids: Sequence[str], hashes: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(positions in ``ids``, rows) of the ids this segment holds; ``hashes``: the ids'
        ``idindex.hash_ids``, when the caller looks up the same batch in many segments."""
        if not len(ids) or not self.n_rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return idindex.lookup(self.id_entries(), self.id_column(), ids, hashes)

    def rows_of(self, ids: Sequence[str], hashes: np.ndarray | None = None) -> np.ndarray:
        """Row of each id in this segment, -1 where absent (last row wins on duplicates)."""
        out = np.full(len(ids), -1, np.int64)
        pos, rows = self.lookup(ids, hashes)
        order = np.argsort(rows, kind="stable")  # the last row of an id is written last
        out[pos[order]] = rows[order]
        return out

    def contains(self, ids: Sequence[str], hashes: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask over this segment's rows: is the row's id among ``ids``."""
        mask = np.zeros(self.n_rows, dtype=bool)
        mask[self.lookup(ids, hashes)[1]] = True
        return mask

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()

    def embeddings(self) -> np.ndarray | None:
        """(n_rows, d) float32 embeddings, a view of the memory map (every kind shares it)."""
        if self._emb is None and "embedding" in self.table.column_names:
            col = self.table.column("embedding").combine_chunks()
            self._emb = col.values.to_numpy(zero_copy_only=False).reshape(len(col), -1)
        return self._emb

    def vector_column(self, name: str) -> np.ndarray | None:
        """(n_rows, d) float32 view of a stored vector column (``vector.<field>``), or None."""
        if name == "embedding":
            return self.embeddings()
        if name not in self._vec and name in self.table.column_names:
            col = self.table.column(name).combine_chunks()
            self._vec[name] = col.values.to_numpy(zero_copy_only=False).reshape(len(col), -1)
        return self._vec.get(name)

    def quality(self) -> np.ndarray:
        """(n_rows,) float32 stored quality estimates (NaN: none, as in older segments)."""
        if self._quality is None:
            self._quality = self._scalar_column(QUALITY_COLUMN, pa.float32(), np.float32,
                                                np.nan)
        return self._quality

    def pruned(self) -> np.ndarray | None:
        """(n_rows,) bool: rows kept out of the costly representations; None when none is."""
        if self._pruned is None:
            got = self._scalar_column(PRUNED_COLUMN, pa.bool_(), bool, False)
            self._pruned = got if got.any() else False
        return None if self._pruned is False else self._pruned

    def _scalar_column(self, name, pa_type, np_type, missing) -> np.ndarray:
        if name not in self.table.column_names:
            return np.full(self.n_rows, missing, np_type)
        col = self.table.column(name)
        if col.type != pa_type:
            raise Corrupt(f"segment {self.id}: column {name!r} is {col.type}, not {pa_type}")
        out = col.fill_null(missing).to_numpy(zero_copy_only=False).astype(np_type, copy=False)
        out.flags.writeable = False
        return out

    def rows(self, rows: Sequence[int], columns: Sequence[str] = ("id", "title", "text")) -> list[dict]:
        sub = self.table.select(list(columns)).take(arrays.int64_array(rows))
        return sub.to_pylist()

    def documents(self, rows: Sequence[int]) -> list[Document]:
        out = []
        fields = [c for c in self.table.column_names
                  if c not in ("id", "title", "text", "metadata_json", "embedding")
                  and not c.startswith(("vector.", "_"))]
        for r in self.rows(rows, ["id", "title", "text", "metadata_json", *fields]):
            meta = json.loads(r["metadata_json"]) if r["metadata_json"] else {}
            meta.update({f: r[f] for f in fields if r[f] is not None})
            out.append(Document(r["id"], r["title"], r["text"], meta))
        return out


def tombstone_bytes(rows: np.ndarray) -> bytes:
    """A tombstone file's content (deleted row ids as an Arrow IPC file); small, so it is
    built in memory and written, fsynced and summed in one step by the writer."""
    table = pa.table({"row": pa.array(np.asarray(rows, dtype=np.int32))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_tombstones(path: Path, n_rows: int, *, sums: dict | None = None,
                    validate: bool = False) -> np.ndarray:
    """Live mask of a segment from its tombstone file (checked against ``sums``, or
    validated in full when it has none and ``validate``)."""
    if sums is not None:
        check_file(path, sums)
    elif validate:
        validate_arrow(path)
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        rows = table.column("row").to_numpy()
    except (OSError, KeyError, pa.ArrowException) as e:
        raise Corrupt(f"cannot read tombstones {path}: {e}") from e
    if table.schema.field("row").type != pa.int32() or \
            (len(rows) and (rows.min() < 0 or rows.max() >= n_rows)):
        raise Corrupt(f"tombstones {path}: row ids outside the segment's {n_rows} rows")
    live = np.ones(n_rows, dtype=bool)
    live[rows] = False
    return live


def load_tombstones(collection: Path, entry) -> np.ndarray:
    """Live mask of a manifest entry's segment (it has a tombstone file), checked against
    the entry's sum and deleted count."""
    path = collection / entry.tombstones
    live = read_tombstones(path, entry.n_rows, sums=entry.tombstones_sum,
                           validate=entry.tombstones_sum is None)
    if entry.n_rows - int(live.sum()) != entry.n_deleted:
        raise Corrupt(f"tombstones {path}: {entry.n_rows - int(live.sum())} deleted rows, the "
                      f"manifest says {entry.n_deleted}")
    return live
