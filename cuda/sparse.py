"""Sparse (UHD latent) scoring in torch: the GPU twin of ``index/sparse_kernels.sparse_search``.

A batch of queries (CSR: ``qptr``, ``qterms``, ``qweights``) against a segment's posting lists
(``offsets``, ``docs``, float16 ``vals``): every posting of every query term is gathered at
once, ``weight x value`` is added into a (queries x rows) score buffer (``index_add_``), rows
no query term touched stay out of the top k (as in the numba kernel, which selects among
touched rows only), and ``torch.topk`` takes each query's best k. Exhaustive: MaxScore's
pruning pays on a CPU reading postings one by one; on a GPU the whole gather is one pass.
Queries are taken in blocks so the score buffer stays bounded.
"""
from __future__ import annotations

import numpy as np
import torch

from polyindex.cuda.tensors import Resident, ranges, topk_rows

BUFFER_ELEMS = 1 << 26  # float32 scores per block of queries (256 MB)


class SparseTensors:
    """A segment's posting lists on a device: offsets, row ids and float32 values."""

    def __init__(self, offsets, docs, vals, binary: bool, n_rows: int, device, half=None,
                 resident: Resident | None = None):
        r = resident or Resident(device)
        self.device = r.device
        self.offsets = r.get(np.asarray(offsets))
        self.docs = r.get(docs).long()
        self.vals = None if binary else r.get(_values(vals, half))
        self.n_rows = n_rows


def _values(vals, half):
    v = np.asarray(vals)
    return half[v] if v.dtype == np.uint16 else v.astype(np.float32)


def search(seg: SparseTensors, qptr, qterms, qweights, k: int, allow=None):
    """Top-k (scores (nq, k) float32, rows (nq, k) int64, -1 padded) of sparse dot products;
    ``allow``: optional (n_rows,) bool. Also returns postings read per query."""
    dev = seg.device
    qptr = np.asarray(qptr, np.int64)
    nq = len(qptr) - 1
    out_s = torch.full((nq, k), float("-inf"), device=dev)
    out_r = torch.full((nq, k), -1, dtype=torch.int64, device=dev)
    counts = np.zeros(nq, np.int64)
    if nq == 0 or k == 0 or seg.n_rows == 0:
        return out_s, out_r, counts
    terms = torch.as_tensor(np.asarray(qterms, np.int64), device=dev)
    weights = torch.as_tensor(np.asarray(qweights, np.float32), device=dev)
    term_q = torch.repeat_interleave(torch.arange(nq, device=dev),
                                     torch.as_tensor(np.diff(qptr), device=dev))
    allow_t = None if allow is None else torch.as_tensor(np.asarray(allow, bool), device=dev)
    lens = (seg.offsets[terms + 1] - seg.offsets[terms]).cpu().numpy()
    run = np.concatenate([[0], np.cumsum(lens)])
    counts = run[qptr[1:]] - run[qptr[:-1]]  # postings read per query, as the CPU counts them
    block = max(1, BUFFER_ELEMS // seg.n_rows)
    for q0 in range(0, nq, block):
        q1 = min(nq, q0 + block)
        sel = torch.arange(int(qptr[q0]), int(qptr[q1]), device=dev)
        pos, slot, _ = ranges(seg.offsets, terms[sel])
        qi = term_q[sel][slot] - q0
        rows = seg.docs[pos]
        w = weights[sel][slot]
        if seg.vals is not None:
            w = w * seg.vals[pos]
        flat = qi * seg.n_rows + rows
        scores = torch.zeros((q1 - q0) * seg.n_rows, device=dev)
        touched = torch.zeros((q1 - q0) * seg.n_rows, dtype=torch.bool, device=dev)
        scores.index_add_(0, flat, w)
        touched[flat] = True
        scores = scores.view(q1 - q0, seg.n_rows)
        live = touched.view(q1 - q0, seg.n_rows)
        if allow_t is not None:
            live = live & allow_t[None, :]
        scores = torch.where(live, scores, torch.full_like(scores, float("-inf")))
        out_s[q0:q1], out_r[q0:q1] = topk_rows(scores, k)
    return out_s, out_r, counts
