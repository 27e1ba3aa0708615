"""The multivector kind's files per segment: writing them from stored tokens, reading
formats 1 and 2 as zero-copy numpy views of the memory-mapped Arrow columns."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from polyindex.errors import Corrupt

TOKENS_FILE = "multivector.tokens.arrow"
DOCS_FILE = "multivector.docs.arrow"
IVF_FILE = "multivector.ivf.arrow"
FORMAT = 2  # 1: per-document list columns in the tokens file (still read)


def write_segment(folder: Path, cb, codes: np.ndarray, res: np.ndarray | None,
                   scale: np.ndarray | None, lengths: np.ndarray) -> dict:
    """A segment's three files from its stored tokens (``lengths`` per document); the
    part of the build info they determine."""
    n = len(lengths)
    code_type = pa.uint8() if cb.k <= 256 else pa.uint16()
    cols = {"codes": pa.array(codes.astype(code_type.to_pandas_dtype()), code_type)}
    if res is not None:
        cols["residual"] = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(cb.m), len(res), [None, pa.py_buffer(np.ascontiguousarray(res))])
        if scale is not None:
            cols["scale"] = pa.array(np.asarray(scale, np.float16), pa.float16())
    _write(folder / TOKENS_FILE, cols)
    # token counts, not offsets: 2 bytes per document instead of 4 (pure-code documents
    # hold few distinct codes, so this is part of their bytes per token)
    len_type = pa.uint16() if lengths.max(initial=0) < 65536 else pa.uint32()
    _write(folder / DOCS_FILE, {"n_tokens": pa.array(lengths, len_type)})
    # inverted lists: centroid -> documents having a token with that code (ascending)
    doc = np.repeat(np.arange(n, dtype=np.int64), lengths)
    pairs = np.unique(codes.astype(np.int64) * max(n, 1) + doc)
    ivf_off = np.concatenate([[0], np.cumsum(np.bincount(pairs // max(n, 1), minlength=cb.k))])
    _write(folder / IVF_FILE, {"docs": pa.ListArray.from_arrays(
        pa.array(ivf_off.astype(np.int32)), pa.array((pairs % max(n, 1)).astype(np.int32)))})
    files = [TOKENS_FILE, DOCS_FILE, IVF_FILE]
    sizes = {f: (folder / f).stat().st_size for f in files}
    return {"format": FORMAT, "n_rows": n, "k": cb.k, "m": cb.m, "bits": cb.bits,
            "scale": res is not None and scale is not None,
            "tokens_stored": int(lengths.sum()), "ivf_entries": int(len(pairs)),
            "bytes": sizes, "files": files}


def _write(path: Path, columns: dict) -> None:
    table = pa.table(columns)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_table(path: Path) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise Corrupt(f"{path}: cannot read Arrow file: {exc}") from None


def list_column(table: pa.Table, name: str, folder: Path):
    if name not in table.column_names or not pa.types.is_list(table.schema.field(name).type):
        raise Corrupt(f"{folder}: multivector file lacks list column {name!r} "
                      f"(schema {table.schema})")
    col = table.column(name)
    col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if col.null_count or col.offset:
        raise Corrupt(f"{folder}: multivector column {name!r} has nulls or a slice offset")
    return col


def open_v2(folder: Path, info: dict, m: int):
    """Format 2: token-level columns in the tokens file, token counts in the docs file."""
    tt = read_table(folder / TOKENS_FILE)
    counts = _column(read_table(folder / DOCS_FILE), "n_tokens", folder)
    if not pa.types.is_unsigned_integer(counts.type):
        raise Corrupt(f"{folder}: multivector n_tokens column has type {counts.type}")
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts.to_numpy(zero_copy_only=True), out=offsets[1:])
    codes = _column(tt, "codes", folder).to_numpy(zero_copy_only=True)
    if offsets[-1] != len(codes):
        raise Corrupt(f"{folder}: multivector documents count {offsets[-1]} tokens, the tokens "
                      f"file holds {len(codes)}")
    res = scale = None
    if m and info.get("scale"):
        sc = _column(tt, "scale", folder)
        if not pa.types.is_float16(sc.type):
            raise Corrupt(f"{folder}: multivector scale column has type {sc.type}")
        scale = sc.to_numpy(zero_copy_only=True).view(np.uint16)
    if m:
        res = _residuals(_column(tt, "residual", folder), m, folder)
    return offsets, codes, res, scale, tt


def open_v1(folder: Path, info: dict, m: int):
    """Format 1: one row per document, list columns sharing int32 offsets."""
    tt = read_table(folder / TOKENS_FILE)
    codes_col = list_column(tt, "codes", folder)
    offsets = codes_col.offsets.to_numpy()
    codes = codes_col.values.to_numpy(zero_copy_only=True)
    res = scale = None
    if m and info.get("scale"):
        sc = list_column(tt, "scale", folder)
        if not pa.types.is_float16(sc.values.type) or len(sc.values) != len(codes):
            raise Corrupt(f"{folder}: multivector scale column does not match its codes")
        scale = sc.values.to_numpy(zero_copy_only=True).view(np.uint16)
    if m:
        res_col = list_column(tt, "residual", folder)
        if not np.array_equal(res_col.offsets.to_numpy(), offsets):
            raise Corrupt(f"{folder}: multivector residual column does not match its codes")
        res = _residuals(res_col.values, m, folder)
    return offsets, codes, res, scale, tt


def _residuals(vals, m: int, folder: Path) -> np.ndarray:
    """(n, M) uint8 view of a fixed_size_binary[M] array (zero copy)."""
    if not pa.types.is_fixed_size_binary(vals.type) or vals.type.byte_width != m:
        raise Corrupt(f"{folder}: multivector residual column has type {vals.type}, "
                      f"expected fixed_size_binary[{m}]")
    if not len(vals):
        return np.zeros((0, m), np.uint8)
    return np.frombuffer(vals.buffers()[1], np.uint8, count=len(vals) * m,
                         offset=vals.offset * m).reshape(-1, m)


def _column(table: pa.Table, name: str, folder: Path):
    if name not in table.column_names:
        raise Corrupt(f"{folder}: multivector file lacks column {name!r} (schema {table.schema})")
    col = table.column(name)
    col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if col.null_count:
        raise Corrupt(f"{folder}: multivector column {name!r} has nulls")
    return col
