"""The lexical index's files in a segment folder: their names and Arrow schemas, and the
checked readers of the forward index and the postings (with their block files)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from polyindex.errors import Corrupt
from polyindex.index import arrays, docids, postings

VOCAB_FILE = "lexical.vocab.arrow"
POSTINGS_FILE = "lexical.postings.arrow"
DOCLEN_FILE = "lexical.doclen.arrow"
FORWARD_FILE = "lexical.forward.arrow"
BLOCKS_FILE = "lexical.blocks.arrow"
WIDE_FILE = "lexical.wide.arrow"
FORMAT = 1

_VOCAB_SCHEMA = {"term": pa.string(), "offset": pa.int64(), "df": pa.int32()}
_POSTINGS_SCHEMA = {"lo": pa.uint16(), "tf": postings.COUNT_TYPES}
_LEGACY_POSTINGS_SCHEMA = {"doc": pa.int32(), "tf": postings.COUNT_TYPES}  # written before
_DOCLEN_SCHEMA = {"len": pa.int32()}
_FORWARD_SCHEMA = {"terms": pa.large_list(pa.int32()), "title_len": pa.int32()}  # own reader
_BOUNDS_SCHEMA = {"last": pa.int32(), "max_tf": pa.int32(), "min_len": pa.int32()}
_BLOCKS_SCHEMA = {**_BOUNDS_SCHEMA, "first": pa.int32(), "wide_at": pa.int64()}
_WIDE_SCHEMA = {"high": pa.uint16()}


def _read_forward(path: Path) -> pa.Table:
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise Corrupt(f"{path}: cannot read Arrow file: {exc}") from None
    for name, typ in _FORWARD_SCHEMA.items():
        if name not in table.column_names or not table.schema.field(name).type.equals(typ):
            raise Corrupt(f"{path}: expected column {name!r} of type {typ}, "
                          f"file schema is {table.schema}")
    return table


def _forward_arrays(folder: Path, table: pa.Table, doclen: np.ndarray, n_terms: int,
                    scan: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zero-copy (row offsets, title_len, term ids) of a forward index file, checked (every
    row and term id only with ``scan``: files no checksum vouches for)."""
    def one(name):
        col = table.column(name)
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    lists = one("terms")
    row_ptr = arrays.view(lists.offsets, zero_copy_only=False)
    ids = arrays.view(lists.values, zero_copy_only=False)
    title_len = arrays.view(one("title_len"), zero_copy_only=False)
    if len(row_ptr) != len(doclen) + 1 or len(title_len) != len(doclen) or (scan and (
            (np.diff(row_ptr) != doclen).any() or (title_len > doclen).any()
            or (len(ids) and (ids.min() < 0 or ids.max() >= n_terms)))):
        raise Corrupt(f"{folder}: {FORWARD_FILE} disagrees with the lexical index")
    return row_ptr, title_len, ids


def _read_postings(folder: Path, info: dict, vocab: dict, n_rows: int, scan: bool):
    """(tables to keep, doc ids ``P``, tfs, block bounds or None, offsets) of a segment's
    postings: 16-bit block-relative ids (``lo`` column, with the blocks and wide files), or a
    plain int32 ``doc`` column (segments written before)."""
    files = info.get("files", ())
    try:
        compact = "lo" in pa.ipc.open_file(pa.memory_map(str(folder / POSTINGS_FILE))).schema.names
    except (OSError, pa.ArrowException):
        compact = False  # read_arrow below says what is wrong with the file
    pt, post = postings.read_arrow(folder / POSTINGS_FILE,
                                   _POSTINGS_SCHEMA if compact else _LEGACY_POSTINGS_SCHEMA)
    n_post = len(post["tf"])
    offsets = np.append(vocab["offset"], np.int64(n_post))
    counts = np.diff(offsets)
    if ("n_rows" in info and info["n_rows"] != n_rows) or (counts < 0).any() \
            or (len(offsets) > 1 and offsets[0] != 0) or (counts != vocab["df"]).any():
        raise Corrupt(f"{folder}: lexical index files are inconsistent "
                      f"(rows {n_rows}, info {info.get('n_rows')}, postings {n_post})")
    boff = docids.block_offsets(offsets)
    keep, blocks = (pt,), None
    if BLOCKS_FILE in files or compact:
        bt, bl = postings.read_arrow(folder / BLOCKS_FILE,
                                     _BLOCKS_SCHEMA if compact else _BOUNDS_SCHEMA)
        if len(bl["last"]) != boff[-1]:
            raise Corrupt(f"{folder}: {BLOCKS_FILE} has {len(bl['last'])} blocks, the "
                          f"postings make {boff[-1]}")
        blocks = (bl["last"], bl["max_tf"], bl["min_len"])
        keep += (bt,)
    if compact:
        wt, wide = postings.read_arrow(folder / WIDE_FILE, _WIDE_SCHEMA)
        keep += (wt,)
        P = (boff, bl["first"], bl["wide_at"], post["lo"], wide["high"], docids.SHIFT)
        if not docids.blocks_valid(P, offsets, n_rows):  # what every read trusts: always
            raise Corrupt(f"{folder}: {BLOCKS_FILE} points outside the postings or the rows")
    else:
        P = docids.legacy(offsets, post["doc"])
    if scan and n_post:
        rows = docids.decode(P, offsets)
        if rows.min() < 0 or rows.max() >= n_rows:
            raise Corrupt(f"{folder}: lexical postings name rows outside 0..{n_rows - 1}")
    return keep, P, post["tf"], blocks, offsets
