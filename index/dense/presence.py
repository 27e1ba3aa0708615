"""Optional vector fields: which rows of a segment have a vector, and searches that see only them.

A document may leave out an ``optional`` named field (and a document pruned by quality has
no vector in any field). The segment records which rows are real in
``dense.FIELD.present.npy`` (the rows' bits, ``np.packbits``, little bit order), written only
when some row lacks a vector, and its faiss index holds the present rows only
(``compact``: build info ``compact``). Segments written before that layout hold a zero
placeholder per absent row and fold this mask into their allow masks (``Presence``: a
placeholder never comes back, not even with score 0, which for ``ip`` would outrank negative
scores). Either way ``vectors(rows)`` gives NaN rows for missing vectors, so the rerank
features see a missing value and a merge copies "missing" as missing.

Inside the engine a missing vector travels as a NaN row of the batch's (n, d) matrix
(``VectorSpec.stack``): validation refuses NaN in any vector a user gives, so a NaN row can
only mean "this document has no vector for the field".
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from polyindex.errors import Corrupt
from polyindex.index.masks import MaskCache, freeze

FOLD_ENTRIES = 16  # allow masks remembered per segment, with the presence folded in


def missing_rows(x: np.ndarray) -> np.ndarray:
    """Boolean mask of the placeholder (NaN) rows of a batch matrix."""
    return np.isnan(x[:, 0]) if len(x) and x.shape[1] else np.zeros(len(x), bool)


def placeholders_zeroed(x: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """The matrix faiss gets: placeholder rows as zeros (a copy only when some are missing)."""
    if not missing.any():
        return x
    out = np.array(x, dtype=np.float32)
    out[missing] = 0.0
    return out


def present_file(index_file: str) -> str:
    return index_file[:-len(".faiss")] + ".present.npy"


def write(folder: Path, index_file: str, present: np.ndarray) -> str:
    name = present_file(index_file)
    np.save(folder / name, np.packbits(present, bitorder="little"), allow_pickle=False)
    return name


def read(folder: Path, index_file: str, n_rows: int, n_missing: int) -> np.ndarray:
    """The segment's frozen presence mask; Corrupt when the file disagrees with the build info."""
    path = folder / present_file(index_file)
    try:
        bits = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise Corrupt(f"{path}: cannot read the optional field's presence mask: {e}") from e
    if bits.dtype != np.uint8 or bits.ndim != 1 or len(bits) != (n_rows + 7) // 8:
        raise Corrupt(f"{path}: presence mask of {bits.shape} {bits.dtype}, the segment has "
                      f"{n_rows} rows")
    present = np.unpackbits(bits, count=n_rows, bitorder="little").astype(bool)
    if n_rows - int(present.sum()) != n_missing:
        raise Corrupt(f"{path}: {n_rows - int(present.sum())} rows without a vector, the "
                      f"build info says {n_missing}")
    return freeze(present)


class Presence:
    """A segment's presence mask folded into allow masks: ``None`` (every row allowed) is the
    presence mask itself; a frozen allow mask's fold is kept (by the mask's identity), so a
    repeated filter or a tombstoned segment costs no O(rows) work per query."""

    def __init__(self, present: np.ndarray):
        self.mask = present
        self._folded = MaskCache(FOLD_ENTRIES)

    def fold(self, allow: np.ndarray | None) -> np.ndarray:
        if allow is None:
            return self.mask
        return self._folded.derived(allow, lambda a: a & self.mask)
