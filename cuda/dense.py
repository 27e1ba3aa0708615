"""Dense search in torch: exact flat and IVF, for a cuda placement without faiss-gpu.

The twin is faiss on the CPU (``index/dense``): ``flat_search`` equals ``IndexFlat`` (inner
product, or ``-squared L2``: higher is better everywhere, as ``DenseSegment`` reports faiss's
results), ``ivf_search`` equals ``IndexIVFFlat`` with the same ``nprobe`` (the segment's own
IVF centroids and inverted lists, the stored float32 vectors scored exactly). An IVF index
whose lists hold compressed codes (``IVF..,PQ..``) is searched the same way over the stored
vectors, so its scores are exact where faiss's are approximate; a graph index (HNSW) is
searched exactly (``flat_search``). The database is scored in blocks of rows, each block's
top k merged into a running top k, so scratch memory stays bounded at 1M x 384 and beyond.
"""
from __future__ import annotations

import numpy as np
import torch

from polyindex.cuda.tensors import ragged_topk, topk_rows

BLOCK_ELEMS = 1 << 26  # query x row scores per block (256 MB of float32)


def _scores(q: torch.Tensor, x: torch.Tensor, xnorm: torch.Tensor | None) -> torch.Tensor:
    s = q @ x.T
    if xnorm is not None:  # l2: -(|q|^2 + |x|^2 - 2 q.x)
        s = 2 * s - (q * q).sum(1, keepdim=True) - xnorm[None, :]
    return s


class DenseTensors:
    """A segment's vectors on a device (float32, or bfloat16/float16 when asked: half the
    memory and bandwidth, scores within that precision), their squared norms for l2."""

    def __init__(self, x: np.ndarray, metric: str, device, dtype=torch.float32):
        self.x = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(device).to(dtype)
        self.xnorm = (self.x.float() ** 2).sum(1) if metric == "l2" else None
        self.n_rows = len(x)
        self.device = self.x.device
        self.ivf = None  # (centroids (nlist, d), list offsets, row ids), set by ``with_ivf``

    def with_ivf(self, centroids: np.ndarray, lists: list[np.ndarray], quantizer_l2: bool):
        sizes = np.array([len(v) for v in lists], np.int64)
        ids = np.concatenate(lists).astype(np.int64) if lists else np.zeros(0, np.int64)
        off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        c = torch.from_numpy(np.ascontiguousarray(centroids, np.float32)).to(self.device)
        self.ivf = (c, (c * c).sum(1) if quantizer_l2 else None,
                    torch.from_numpy(off).to(self.device), torch.from_numpy(ids).to(self.device))
        return self


def flat_search(seg: DenseTensors, q: np.ndarray, k: int, allow=None):
    """Exact top-k (nq, k) of every row (allowed rows only)."""
    dev = seg.device
    qt = torch.from_numpy(np.ascontiguousarray(q, np.float32)).to(dev)
    nq = len(qt)
    best_s = torch.full((nq, k), float("-inf"), device=dev)
    best_r = torch.full((nq, k), -1, dtype=torch.int64, device=dev)
    if k == 0 or seg.n_rows == 0:
        return best_s, best_r
    allow_t = None if allow is None else torch.as_tensor(np.asarray(allow, bool), device=dev)
    step = max(k, BLOCK_ELEMS // max(1, nq))
    qx = qt.to(seg.x.dtype)
    for s in range(0, seg.n_rows, step):
        e = min(seg.n_rows, s + step)
        sc = _scores(qx, seg.x[s:e], None if seg.xnorm is None else seg.xnorm[s:e]).float()
        if allow_t is not None:
            sc = sc.masked_fill(~allow_t[None, s:e], float("-inf"))
        bs, br = topk_rows(sc, k)
        br = torch.where(br >= 0, br + s, br)
        best_s, best_r = topk_rows(torch.cat([best_s, bs], 1), k, torch.cat([best_r, br], 1))
    return best_s, best_r


def ivf_search(seg: DenseTensors, q: np.ndarray, k: int, nprobe: int, allow=None):
    """IVF top-k: each query's ``nprobe`` nearest lists, their rows scored exactly."""
    dev = seg.device
    cent, cnorm, off, ids = seg.ivf
    qt = torch.from_numpy(np.ascontiguousarray(q, np.float32)).to(dev)
    nq = len(qt)
    nprobe = max(1, min(nprobe, len(cent)))
    probes = torch.topk(_scores(qt, cent, cnorm), nprobe, dim=1).indices  # (nq, nprobe)
    starts, lens = off[probes], off[probes + 1] - off[probes]  # (nq, nprobe)
    tot = lens.sum(1)
    qid = torch.repeat_interleave(torch.arange(nq, device=dev), tot)
    flat_lens = lens.reshape(-1)
    slot = torch.repeat_interleave(torch.arange(len(flat_lens), device=dev), flat_lens)
    first = torch.cumsum(flat_lens, 0) - flat_lens
    pos = torch.arange(len(slot), device=dev) - first[slot] + starts.reshape(-1)[slot]
    rows = ids[pos]
    x = seg.x[rows].float()
    s = (x * qt[qid]).sum(1)
    if seg.xnorm is not None:
        s = 2 * s - (qt[qid] ** 2).sum(1) - seg.xnorm[rows]
    if allow is not None:
        a = torch.as_tensor(np.asarray(allow, bool), device=dev)
        s = s.masked_fill(~a[rows], float("-inf"))
    return ragged_topk(s, rows, qid, tot, nq, k)


def ivf_parts(index):
    """(centroids, per-list row ids, quantizer is l2) of a faiss IVF index (read on the CPU)."""
    import faiss
    ivf = faiss.extract_index_ivf(index)
    centroids = ivf.quantizer.reconstruct_n(0, ivf.nlist)
    inv = ivf.invlists
    lists = []
    for i in range(ivf.nlist):
        n = inv.list_size(i)
        lists.append(faiss.rev_swig_ptr(inv.get_ids(i), n).copy() if n else
                     np.zeros(0, np.int64))
    return centroids, lists, ivf.metric_type == faiss.METRIC_L2
