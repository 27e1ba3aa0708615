"""A segment's document-id index: id -> row by binary search over sorted 64-bit hashes.

Each segment stores ``ids.index.arrow``: the xxh3_64 of every row's id, sorted, and the row
of each (uint64 and int32 columns, memory-mapped: 12 bytes a row, no Python object per id).
Looking up a batch of ids costs the batch's hashes and two binary searches per segment, so
an upsert or delete touches what it writes, not the corpus; a hash match is confirmed by
comparing the stored id, so collisions cost a comparison, never a wrong row. A merged
segment's index is the sources' entries re-numbered and re-sorted: no id is hashed again.
Segments written before this file existed get the same index computed once at first use.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import xxhash

from polyindex.errors import Corrupt
from polyindex.index import arrays

ID_INDEX_FILE = "ids.index.arrow"
_hash = xxhash.xxh3_64_intdigest


def hash_ids(ids: Sequence[str]) -> np.ndarray:
    return np.fromiter((_hash(i.encode()) for i in ids), dtype=np.uint64, count=len(ids))


def sorted_entries(hashes: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(hashes, kind="stable")
    return hashes[order], rows[order].astype(np.int32)


def write(folder: Path, hashes: np.ndarray, rows: np.ndarray) -> None:
    """Write the (already sorted) entries."""
    table = pa.table({"hash": pa.array(hashes, pa.uint64()), "row": pa.array(rows, pa.int32())})
    with pa.OSFile(str(folder / ID_INDEX_FILE), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)


def write_for(folder: Path, ids: Sequence[str]) -> None:
    write(folder, *sorted_entries(hash_ids(ids), np.arange(len(ids))))


def merged(parts: Sequence[tuple[tuple[np.ndarray, np.ndarray], np.ndarray, int]]) \
        -> tuple[np.ndarray, np.ndarray]:
    """Entries of a merged segment from each source's ``(hashes, rows)``, the rows it keeps
    (ascending) and its source's row count: kept rows re-numbered in merged order."""
    out_h, out_r, base = [], [], 0
    for (hashes, rows), kept, n_rows in parts:
        new_row = np.full(n_rows, -1, np.int64)
        new_row[kept] = base + np.arange(len(kept))
        mapped = new_row[rows]
        keep = mapped >= 0
        out_h.append(hashes[keep])
        out_r.append(mapped[keep])
        base += len(kept)
    if not out_h:
        return np.zeros(0, np.uint64), np.zeros(0, np.int32)
    return sorted_entries(np.concatenate(out_h), np.concatenate(out_r))


def read(path: Path, n_rows: int, scan: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The (hashes, rows) of an id index file, memory-mapped; ``scan``: check every row
    number (skipped for a file its checksum vouches for: the scan makes it all resident)."""
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        hashes = arrays.view(table.column("hash"))
        rows = arrays.view(table.column("row"))
    except (OSError, KeyError, pa.ArrowException) as e:
        raise Corrupt(f"{path}: cannot read the id index: {e}") from e
    if len(hashes) != n_rows or len(rows) != n_rows or table.schema.field("hash").type != pa.uint64() \
            or (scan and n_rows and (rows.min() < 0 or rows.max() >= n_rows)):
        raise Corrupt(f"{path}: the id index does not match the segment's {n_rows} rows")
    return hashes, rows


def lookup(entries: tuple[np.ndarray, np.ndarray], id_column: pa.ChunkedArray,
           ids: Sequence[str], hashes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``ids``, rows) of the ids this segment holds (every row of an id)."""
    sorted_h, rows = entries
    qh = hash_ids(ids) if hashes is None else hashes
    lo = np.searchsorted(sorted_h, qh, side="left")
    hi = np.searchsorted(sorted_h, qh, side="right")
    hit = np.flatnonzero(hi > lo)
    if not len(hit):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    counts = (hi - lo)[hit]
    qpos = np.repeat(hit, counts)
    # every entry of each matching hash (one, short of a collision)
    starts = np.repeat(lo[hit] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    cand = rows[np.arange(int(counts.sum())) + starts].astype(np.int64)
    stored = id_column.take(pa.array(cand)).to_pylist()
    same = np.fromiter((s == ids[q] for s, q in zip(stored, qpos.tolist())), bool, len(cand))
    return qpos[same], cand[same]
