"""Multivector (late interaction) kernels in torch: the GPU twin of ``index/multivector_kernels``.

The same MaxSim as the numba kernels, as tensor programs: a candidate document's tokens are
gathered (CSR ranges), each token's score per query token is looked up (first pass: the query
x centroid table ``lut_t[code]``; final pass: that plus the M residual sub-tables
``pq_t[m, res[m]]``, times the token's stored scale: the decoded token's dot product), and a
scatter-reduce (amax) per (document, query token) followed by a sum over query tokens gives
MaxSim. A document without tokens scores 0.

Two entry points:
- ``Kernels(device)``: the ``backend()`` seam of ``index/multivector_kernels`` (same function
  names and numpy arguments: one query, or a batch of queries' candidates, per call), used by ``MultivectorSegment`` on a cuda
  placement (or ``POLYINDEX_KERNELS=torch``); segment arrays are copied to the device once
  (``Resident``);
- ``search_batch``: a whole batch of queries on one segment on the device (candidates, first
  pass, survivors, final pass, top-k), queries padded to one token count with zero table
  columns (a zero column adds max(0) = 0 to every non-empty document: MaxSim unchanged).
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from polyindex.cuda.tensors import Resident, ragged_topk, ranges, to_tensor, topk_rows

CHUNK_ELEMS = 1 << 25  # float32 elements per gathered block (128 MB): bounds scratch memory


def _maxsim(vals: torch.Tensor, slot: torch.Tensor, lens: torch.Tensor, n: int) -> torch.Tensor:
    """Sum over query tokens (columns) of the max over each document's token rows."""
    best = torch.full((n, vals.shape[1]), float("-inf"), dtype=vals.dtype, device=vals.device)
    best.scatter_reduce_(0, slot[:, None].expand_as(vals), vals, "amax", include_self=True)
    best[lens == 0] = 0.0
    return best.sum(1)


def _token_scores(lut, pq, codes, res, scale, pos, tq):
    """(n_pos, T) scores of stored tokens at ``pos``: table lookups; ``pq`` None: codes only.
    ``tq`` (n_pos,) is the query (first axis of ``lut``/``pq``) of each token, or None."""
    c = codes[pos].long()
    vals = lut[c] if tq is None else lut[tq, c]
    if pq is None:
        return vals
    m = res.shape[1]
    idx = res[pos].long() + torch.arange(m, device=res.device) * 256  # (n_pos, M)
    flat = pq.reshape(-1, pq.shape[-1]) if tq is None else pq.reshape(pq.shape[0], -1, pq.shape[-1])
    sub = flat[idx] if tq is None else flat[tq[:, None], idx]  # (n_pos, M, T)
    vals = vals + sub.sum(1)
    if scale is not None:
        vals = vals * scale[pos, None]
    return vals


def maxsim_pass(lut, pq, seg: "SegmentTensors", cand: torch.Tensor,
                qid: torch.Tensor | None = None) -> torch.Tensor:
    """MaxSim of candidate rows ``cand``; ``lut`` (K, T) or (nq, K, T) with ``qid`` giving each
    candidate's query; ``pq`` (M, 256, T) / (nq, M, 256, T) for the final pass, else None."""
    out = torch.empty(len(cand), dtype=torch.float32, device=cand.device)
    t = lut.shape[-1]
    per_tok = t * (1 + (0 if pq is None else pq.shape[-3]))
    lens_all = seg.offsets[cand + 1] - seg.offsets[cand]
    # documents per block so that the gathered (tokens x M x T) block stays bounded
    avg = max(1.0, float(lens_all.float().mean())) if len(cand) else 1.0
    step = max(1, int(CHUNK_ELEMS // (per_tok * avg)))
    for s in range(0, len(cand), step):
        c = cand[s:s + step]
        pos, slot, lens = ranges(seg.offsets, c)
        tq = None if qid is None else qid[s:s + step][slot]
        vals = _token_scores(lut, pq, seg.codes, seg.res if pq is not None else None,
                             seg.scale if pq is not None else None, pos, tq)
        out[s:s + len(c)] = _maxsim(vals, slot, lens, len(c))
    return out


class SegmentTensors:
    """One segment's multivector arrays on a device (codes widened to int32, scales as
    float32 values), built from the segment's numpy arrays."""

    def __init__(self, offsets, codes, res, scale, ivf_offsets, ivf_docs, device, half=None):
        dev = torch.device(device)
        self.offsets = to_tensor(np.asarray(offsets, np.int64), dev)
        self.codes = to_tensor(codes, dev)
        self.res = None if res is None else to_tensor(res, dev)
        self.scale = None
        if scale is not None and len(scale):
            s = np.asarray(scale)
            s = half[s] if s.dtype == np.uint16 else s.astype(np.float32)
            self.scale = to_tensor(np.asarray(s, np.float32), dev)
        self.ivf_offsets = to_tensor(np.asarray(ivf_offsets, np.int64), dev)
        self.ivf_docs = to_tensor(np.asarray(ivf_docs, np.int64), dev)
        self.n_rows = len(offsets) - 1


def candidates(seg: SegmentTensors, probes: torch.Tensor, allow: torch.Tensor | None = None):
    """Rows listed under any probed centroid, each once, ascending; allowed rows only."""
    pos, _, _ = ranges(seg.ivf_offsets, probes)
    rows = torch.unique(seg.ivf_docs[pos])
    return rows if allow is None else rows[allow[rows]]


def hamming_lut(qsig: np.ndarray, csig: np.ndarray, nbits: int) -> np.ndarray:
    """(K, nqt) Hamming similarities ``(b - 2 * popcount(q ^ c)) / b``: the binary first pass
    is the LUT first pass over this table."""
    x = np.bitwise_xor(csig[:, None], qsig[None, :])
    return ((nbits - 2 * np.bitwise_count(x).astype(np.int64)) / np.float32(nbits)).astype(np.float32)


def search_batch(seg: SegmentTensors, luts: list[np.ndarray], pqs: list[np.ndarray] | None,
                 probes: list[np.ndarray], k: int, ndocs: int, allow=None):
    """Top-k rows of a batch of queries on one segment, all on the device: per query its
    candidates (probed inverted lists), the code-only first pass over every query's
    candidates at once, each query's best ``max(k, ndocs)``, the final pass over those, top k.
    ``luts``: per query (K, nqt); ``pqs``: per query (M, 256, nqt) or None (codes only)."""
    dev = seg.offsets.device
    nq = len(luts)
    t = max((lut.shape[1] for lut in luts), default=0)
    lut = torch.zeros((nq, luts[0].shape[0] if nq else 0, t), dtype=torch.float32, device=dev)
    for i, x in enumerate(luts):
        lut[i, :, :x.shape[1]] = torch.from_numpy(np.asarray(x, np.float32)).to(dev)
    pq = None
    if pqs is not None and seg.res is not None:
        m = pqs[0].shape[0]
        pq = torch.zeros((nq, m, 256, t), dtype=torch.float32, device=dev)
        for i, x in enumerate(pqs):
            pq[i, :, :, :x.shape[2]] = torch.from_numpy(np.asarray(x, np.float32)).to(dev)
    allow_t = None if allow is None else torch.as_tensor(np.asarray(allow, bool), device=dev)
    cands = [candidates(seg, torch.as_tensor(np.asarray(p, np.int64), device=dev), allow_t)
             for p in probes]
    keep = max(k, ndocs)
    if pq is not None and any(len(c) > keep for c in cands):  # first pass picks the survivors
        cand = torch.cat(cands)
        qid = torch.repeat_interleave(torch.arange(nq, device=dev),
                                      torch.tensor([len(c) for c in cands], device=dev))
        first = maxsim_pass(lut, None, seg, cand, qid)
        width = max(len(c) for c in cands)
        grid = torch.full((nq, width), float("-inf"), device=dev)
        rowg = torch.full((nq, width), -1, dtype=torch.int64, device=dev)
        col = torch.arange(len(cand), device=dev) - torch.repeat_interleave(
            torch.cumsum(torch.tensor([0] + [len(c) for c in cands[:-1]], device=dev), 0),
            torch.tensor([len(c) for c in cands], device=dev))
        grid[qid, col], rowg[qid, col] = first, cand
        _, best = topk_rows(grid, keep, rowg)
        cands = [b[b >= 0] for b in best]
    cand = torch.cat(cands) if cands else torch.zeros(0, dtype=torch.int64, device=dev)
    sizes = torch.tensor([len(c) for c in cands], device=dev)
    qid = torch.repeat_interleave(torch.arange(nq, device=dev), sizes)
    final = maxsim_pass(lut, pq, seg, cand, qid)
    return ragged_topk(final, cand, qid, sizes, nq, k)


class Kernels:
    """The numba kernels' functions (``index/multivector_kernels.CpuKernels``) in torch, one
    query at a time, numpy in and out; segment arrays stay resident on the device."""

    def __init__(self, device: str, half: np.ndarray):
        self.name = f"torch-{device}"
        self.device = torch.device(device)
        self.res_cache = Resident(device)
        self._half = half

    def _seg(self, offsets, codes, res=None, scale=None):
        r = self.res_cache
        seg = SegmentTensors.__new__(SegmentTensors)
        seg.offsets, seg.codes = r.get(offsets), r.get(codes)
        seg.res = None if res is None else r.get(res)
        seg.scale = None
        if scale is not None and len(scale):
            seg.scale = r.get(_scale_values(scale, self._half))
        return seg

    def _run(self, lut_t, pq_t, seg, cand, out):
        c = torch.from_numpy(np.asarray(cand, np.int64)).to(self.device)
        lut = torch.from_numpy(np.ascontiguousarray(lut_t, np.float32)).to(self.device)
        pq = None if pq_t is None else torch.from_numpy(
            np.ascontiguousarray(pq_t, np.float32)).to(self.device)
        out[:] = maxsim_pass(lut, pq, seg, c).cpu().numpy()

    def _run_batch(self, luts, pqs, seg, qid, cand, out):
        """Many queries' candidates in one pass: tables (nq, K, T) / (nq, M, 256, T) padded
        with zero columns past a query's tokens (a zero column adds max(0) = 0: MaxSim of a
        non-empty document unchanged)."""
        c = torch.from_numpy(np.asarray(cand, np.int64)).to(self.device)
        q = torch.from_numpy(np.asarray(qid, np.int64)).to(self.device)
        lut = torch.from_numpy(np.ascontiguousarray(luts, np.float32)).to(self.device)
        pq = None if pqs is None else torch.from_numpy(
            np.ascontiguousarray(pqs, np.float32)).to(self.device)
        out[:] = maxsim_pass(lut, pq, seg, c, q).cpu().numpy()

    def first_pass_lut_batch(self, luts, nqt, qid, offsets, codes, cand, out):
        self._run_batch(luts, None, self._seg(offsets, codes), qid, cand, out)

    def first_pass_pruned_batch(self, luts, kept, nqt, qid, offsets, codes, cand, out):
        """The numba kernel's definition: the first pass over tables whose pruned centroids'
        rows are zero."""
        zeroed = np.asarray(luts, np.float32) * (np.asarray(kept) != 0)[..., None]
        self._run_batch(zeroed, None, self._seg(offsets, codes), qid, cand, out)

    def final_pass_pq_batch(self, luts, pqs, nqt, qid, offsets, codes, res, scale, half, cand,
                            out):
        self._run_batch(luts, pqs, self._seg(offsets, codes, res, scale), qid, cand, out)

    def first_pass_lut(self, lut_t, offsets, codes, cand, out):
        self._run(lut_t, None, self._seg(offsets, codes), cand, out)

    def first_pass_hamming(self, qsig, csig, nbits, offsets, codes, cand, out):
        self._run(hamming_lut(qsig, csig, nbits), None, self._seg(offsets, codes), cand, out)

    def final_pass_pq(self, lut_t, pq_t, offsets, codes, res, scale, half, cand, out):
        self._run(lut_t, pq_t, self._seg(offsets, codes, res, scale), cand, out)

    def gather_candidates(self, ivf_offsets, ivf_docs, probes, allow, use_allow, mark, out):
        r = self.res_cache
        seg = SegmentTensors.__new__(SegmentTensors)
        seg.ivf_offsets, seg.ivf_docs = r.get(ivf_offsets), r.get(ivf_docs)
        a = torch.from_numpy(np.asarray(allow, bool)).to(self.device) if use_allow else None
        rows = candidates(seg, torch.from_numpy(np.asarray(probes, np.int64)).to(self.device), a)
        n = len(rows)
        out[:n] = rows.cpu().numpy()
        return n


_SCALES: dict[int, tuple] = {}


def _scale_values(scale: np.ndarray, half: np.ndarray) -> np.ndarray:
    """float32 values of a segment's float16-bit scales, computed once per scale array (the
    returned array is what ``Resident`` keys on, so it must be the same object each time);
    dropped with the scale array."""
    key = id(scale)
    hit = _SCALES.get(key)
    if hit is not None and hit[0]() is scale:
        return hit[1]
    vals = half[np.asarray(scale)]
    _SCALES[key] = (weakref.ref(scale, lambda _r: _SCALES.pop(key, None)), vals)
    return vals
