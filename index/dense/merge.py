"""Merging IVF segments from their codes: the kept rows' inverted-list entries copied.

Every IVF segment of a collection starts from a clone of the collection's one trained
template (``DenseKind.template``), so a row's list and code in a source segment are exactly
what adding its vector to a fresh clone would give. A merge therefore copies, list by list,
the kept rows' (code, id) entries with their ids re-numbered to merged rows, instead of
assigning and encoding every vector again (issue 43: at 1M rows the re-encoding was the
merges' largest cost). Entries stay in ascending id order within a list (sources in merged
order, each list in its source's row order), the order ``index.add`` writes them in.

Work: one pass over each source's lists (nlist per source, not per row) and the codes
themselves; memory: the merged index's codes and ids (``code_size + 8`` bytes a row).
"""
from __future__ import annotations

from typing import Sequence

import faiss
import numpy as np


def mergeable(template, parts: Sequence) -> bool:
    """Whether ``parts`` ((segment index, kept rows)) can be merged by copying codes into a
    clone of ``template``: every source a plain CPU IVF index with the template's lists and
    code size, every row present (no optional-field or pruned compaction)."""
    ivf_t = faiss.try_extract_index_ivf(template) if template is not None else None
    if ivf_t is None:
        return False
    for seg, _ in parts:
        index = getattr(seg, "index", None)
        if index is None or getattr(seg, "on_gpu", True) or getattr(seg, "presence", 1) is not None:
            return False
        ivf = faiss.try_extract_index_ivf(index)
        same_type = type(faiss.downcast_index(index)) is type(faiss.downcast_index(template))
        if (ivf is None or not same_type
                or ivf.nlist != ivf_t.nlist or ivf.code_size != ivf_t.code_size
                or index.d != template.d or index.metric_type != template.metric_type):
            return False
    return True


def _list(invlists, l: int, code_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, codes) of inverted list ``l``, copied out of faiss's storage."""
    n = invlists.list_size(l)
    ids_p, codes_p = invlists.get_ids(l), invlists.get_codes(l)
    try:
        ids = faiss.rev_swig_ptr(ids_p, n).copy()
        codes = faiss.rev_swig_ptr(codes_p, n * code_size).copy().reshape(n, code_size)
    finally:
        invlists.release_ids(l, ids_p)
        invlists.release_codes(l, codes_p)
    return ids, codes


def merge_codes(template, parts: Sequence):
    """A clone of ``template`` holding the kept rows of ``parts`` (``mergeable``), row ``i``
    of the merged segment under id ``i``."""
    index = faiss.clone_index(template)
    ivf = faiss.extract_index_ivf(index)
    nlist, cs = ivf.nlist, ivf.code_size
    ids_by_list: list[list[np.ndarray]] = [[] for _ in range(nlist)]
    codes_by_list: list[list[np.ndarray]] = [[] for _ in range(nlist)]
    base = 0
    for seg, rows in parts:
        src = faiss.extract_index_ivf(seg.index)
        new_id = np.full(src.ntotal, -1, np.int64)
        new_id[rows] = base + np.arange(len(rows), dtype=np.int64)
        inv = src.invlists
        for l in range(nlist):
            if not inv.list_size(l):
                continue
            ids, codes = _list(inv, l, cs)
            mapped = new_id[ids]
            keep = mapped >= 0
            if keep.any():
                ids_by_list[l].append(mapped[keep])
                codes_by_list[l].append(codes[keep])
        base += len(rows)
    total = 0
    for l in range(nlist):
        if not ids_by_list[l]:
            continue
        ids = np.ascontiguousarray(np.concatenate(ids_by_list[l]))
        codes = np.ascontiguousarray(np.concatenate(codes_by_list[l]))
        ids_by_list[l] = codes_by_list[l] = None  # freed as they are added
        ivf.invlists.add_entries(l, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(codes))
        total += len(ids)
    if total != base:
        raise RuntimeError(f"IVF merge: {total} entries for {base} rows")
    ivf.ntotal = total
    index.ntotal = total
    return index
