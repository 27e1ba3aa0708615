"""The sparse projector: a k-sparse autoencoder from dense embeddings (d) to D >> d latents.

Model (TopK sparse autoencoder, Gao et al. 2024 "Scaling and evaluating sparse autoencoders"):
``z = TopK_k(ReLU(W_enc (x - b_pre) + b_enc))``, ``x_hat = b_pre + W_dec^T z`` with unit-norm
decoder rows. Training loss, on CPU with torch, deterministic for a seed and thread count:

- **reconstruction** (normalized MSE) at several k at once (Multi-TopK: the prefixes of one
  top-k_max selection), so one projector serves any doc/query k from the set and query-time
  changes of k degrade gracefully;
- **contrastive (distilled InfoNCE)**: a batch is anchors plus each anchor's ``pool`` nearest
  dense neighbours (mined once with FAISS on the training sample). The sparse scores
  ``z_a . z_c`` of every anchor against the whole batch go through a softmax and are pulled
  (KL) to the softmax of the dense similarities ``x_a . x_c`` at a low temperature: the
  neighbours are the positives, the rest of the batch the in-batch negatives, and the dense
  teacher says how positive each one is. Positives are dense neighbours rather than
  title/body halves or dropout views: it needs no re-encoding (bounded time, no model at
  train time) and it optimizes what retrieval needs, that the sparse top list contains the
  dense top list. The k of this loss is drawn from the Multi-TopK set per step;
- **load balancing and dead latents**: the top-k *selection* adds a per-latent bias that is
  not trained by the loss but nudged after every step towards the uniform firing rate k/D
  (auxiliary-loss-free load balancing, Wang et al. 2024): no latent stays dead and no latent
  fires for a large part of the corpus, which keeps posting lists short and even (a few hot
  latents otherwise make every query read a third of the postings). Latents that have not
  fired for ``dead_after`` samples also get the AuxK loss (the top 2k dead latents
  reconstruct the residual, weight 1/32), and a FLOPS term (sum over latents of the squared
  mean activation in the batch, as in SPLADE) penalizes the expected postings read.

Time is bounded: training uses a random sample of at most ``max_train`` rows, and the number
of steps is ``epochs`` passes over that sample (in batch rows, at least 15 steps per epoch),
so 100k documents cost about what 20k do.
Inference needs no torch: ``encode`` keeps the encoder (W_enc, folded bias) in numpy; queries
go through an int8 copy of it in a numba kernel.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

WEIGHTS_FILE = "sparse.projector.npz"
META_FILE = "sparse.projector.json"
ENCODE_CHUNK = 2048  # rows per matmul: bounds the (rows x D) pre-activation buffer
RECON_CHUNK = 128  # rows per least-squares batch: bounds the (rows x k x k) Gram buffer
RIDGE = 1e-4
GRAM_MAX_DIM = 8192  # keep the whole decoder Gram matrix up to this D (256 MB)


@numba.njit(cache=True, nogil=True, fastmath=True)
def _affine_q8(wq, scale, bias, x, out):
    """out[i, j] = scale[j] * (wq[j] . x[i]) + bias[j] with int8 weights (one thread, SIMD)."""
    for i in range(x.shape[0]):
        for j in range(wq.shape[0]):
            acc = np.float32(0.0)
            for t in range(wq.shape[1]):
                acc += np.float32(wq[j, t]) * x[i, t]
            out[i, j] = acc * scale[j] + bias[j]


@numba.njit(cache=True, nogil=True, fastmath=True)
def _project(w, x, out):
    """out[i, j] = w[j] . x[i] (float32, one thread, SIMD): a query's decoder weights without a
    BLAS call, whose thread start-up costs more than the product on a busy machine."""
    for i in range(x.shape[0]):
        for j in range(w.shape[0]):
            acc = np.float32(0.0)
            for t in range(w.shape[1]):
                acc += w[j, t] * x[i, t]
            out[i, j] = acc


@numba.njit(cache=True, nogil=True)
def _gather_gram(gram_all, dims, out):
    """out[i, a, b] = gram_all[dims[i, a], dims[i, b]] (the lower triangle; potrf reads only
    that)."""
    for i in range(dims.shape[0]):
        for a in range(dims.shape[1]):
            row = gram_all[dims[i, a]]
            for b in range(a + 1):
                out[i, a, b] = row[dims[i, b]]


def _cholesky_lower(g: np.ndarray, potrf) -> None:
    """g (k x k float32, lower triangle) := its lower Cholesky factor after adding the ridge;
    a larger ridge when rounding leaves near-parallel atoms not positive definite."""
    base = g.copy()
    for ridge in (RIDGE, 1e-2, 1.0):
        g[:] = base
        g[np.diag_indices_from(g)] += ridge
        # g is C-ordered, so LAPACK sees g^T: its upper factor U (g^T = U^T U) read back in C
        # order is L = U^T with g = L L^T, in the lower triangle
        c, info = potrf(g.T, lower=0, overwrite_a=1, clean=0)
        if info == 0:
            g[:] = c.T
            return
    raise ValueError("sparse recon: the atoms' Gram matrix is not positive definite")


@numba.njit(cache=True, nogil=True)
def _cholesky_solve(chol, rhs, out):
    """out[i] = (L L^T)^-1 rhs[i] for each row's lower Cholesky factor L = chol[i] (forward
    then back substitution, float64 sums)."""
    n, k = rhs.shape
    y = np.empty(k, np.float64)
    for i in range(n):
        L = chol[i]
        for a in range(k):
            acc = np.float64(rhs[i, a])
            for b in range(a):
                acc -= L[a, b] * y[b]
            y[a] = acc / L[a, a]
        for a in range(k - 1, -1, -1):
            acc = y[a]
            for b in range(a + 1, k):
                acc -= L[b, a] * out[i, b]
            out[i, a] = acc / L[a, a]


def _top(pick: np.ndarray, values: np.ndarray, k: int, key=None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k columns of largest ``pick`` (every column when k covers them all):
    ``(values, columns)`` ordered by ``key(values)`` descending (default: the values), then by
    column, so the order is deterministic."""
    k = min(int(k), pick.shape[1])
    part = np.argpartition(-pick, k - 1, axis=1)[:, :k] if k < pick.shape[1] else \
        np.broadcast_to(np.arange(pick.shape[1]), pick.shape).copy()
    v = np.take_along_axis(values, part, 1)
    order = np.lexsort((part, -(v if key is None else key(v))), axis=1)
    return np.take_along_axis(v, order, 1), np.take_along_axis(part, order, 1)


@dataclass
class TrainConfig:
    dim: int  # D
    ks: tuple[int, ...]  # Multi-TopK set (ascending)
    seed: int = 0
    epochs: int = 10
    min_steps_per_epoch: int = 15
    max_train: int = 20_000
    anchors: int = 64  # anchors per step; the batch is anchors x (1 + pool)
    pool: int = 7
    lr: float = 1e-3
    tau: float = 0.02  # teacher temperature on dense cosine similarities
    w_contrastive: float = 1.0
    dead_after: int = 10_000  # samples without firing after which a latent is dead
    w_flops: float = 0.5
    balance: float = 1e-2  # step of the load-balancing selection bias (0: off)
    threads: int = 1  # torch threads while training (results depend on it)
    log: list = field(default_factory=list)


class Projector:
    """Encoder half of a trained k-sparse autoencoder (numpy, float32)."""

    def __init__(self, w_enc: np.ndarray, bias: np.ndarray, meta: dict,
                 balance: np.ndarray | None = None, w_dec: np.ndarray | None = None,
                 centre: np.ndarray | None = None):
        self.w_enc = np.ascontiguousarray(w_enc, dtype=np.float32)  # (D, d)
        self.bias = np.ascontiguousarray(bias, dtype=np.float32)  # (D,) = b_enc - W_enc b_pre
        # added to pre-activations to *select* the top k (load balancing), not to the weights
        self.balance = np.zeros_like(self.bias) if balance is None else \
            np.ascontiguousarray(balance, dtype=np.float32)
        self.meta = meta
        self.dim, self.in_dim = self.w_enc.shape
        # decoder rows (D, d) of a freshly trained projector (issue 23): a query can be scored
        # against the documents' reconstructions (``decode_query``); None when loaded from an
        # artifact saved without it (the default: it lost, see ``save``)
        self.w_dec = None if w_dec is None else np.ascontiguousarray(w_dec, dtype=np.float32)
        # mean of the training rows: ``encode_recon`` fits the documents' deviation from it
        # (q . centre is one constant per query, so it never changes a ranking)
        self.centre = None if centre is None else np.ascontiguousarray(centre, dtype=np.float32)
        self._gram_all = None  # W_dec W_dec^T, made by the first ``encode_recon``
        # Queries encode with int8 rows (per-row scale): a query reads the whole encoder, so
        # its time is memory-bound; int8 reads a quarter of float32 (pre-activations move by
        # ~0.5% of a row's range, which only reorders near-tied query latents).
        self.q_scale = np.maximum(np.abs(self.w_enc).max(axis=1), 1e-30) / 127.0
        self.w_q8 = np.round(self.w_enc / self.q_scale[:, None]).astype(np.int8)
        self.q_scale = self.q_scale.astype(np.float32)

    def encode(self, x: np.ndarray, k: int, queries: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-k latents of each row: ``(weights float32 (n, k), dims int32 (n, k))``, weights
        descending; latents cut by the ReLU keep weight 0 (callers drop them). Documents use
        float32 BLAS; ``queries`` use the int8 encoder in a one-thread numba kernel (no BLAS
        thread start-up, a quarter of the memory traffic), whatever the batch size."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, k = len(x), min(int(k), self.dim)
        vals = np.zeros((n, k), np.float32)
        dims = np.zeros((n, k), np.int32)
        for s in range(0, n, ENCODE_CHUNK):
            if queries:
                pre = np.empty((len(x[s:s + ENCODE_CHUNK]), self.dim), np.float32)
                _affine_q8(self.w_q8, self.q_scale, self.bias, x[s:s + ENCODE_CHUNK], pre)
            else:
                pre = x[s:s + ENCODE_CHUNK] @ self.w_enc.T
                pre += self.bias
            v, part = _top(pre + self.balance, pre, k)  # weight descending, then dim
            vals[s:s + len(pre)] = np.maximum(v, 0)
            dims[s:s + len(pre)] = part
        return vals, dims

    def decode_query(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Query latents for scoring against document *reconstructions*: ``q . x_hat(d) =
        q . b_pre + sum_j z_dj (w_dec_j . q)``, so latent j weighs ``w_dec_j . q`` (the constant
        does not change a ranking). The top k positive weights, as ``encode`` returns them."""
        u = self._decoder_weights(q)
        v, part = _top(u, u, k)
        return np.maximum(v, 0), part.astype(np.int32)

    def encode_recon(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Document codes for ``recon`` scoring: the encoder's top-k latents (as ``encode``
        picks them) with the weights that best rebuild the row from their decoder atoms,
        ``argmin_z |x - centre - W_dec[S]^T z|^2`` (a small ridge keeps near-parallel atoms
        stable). Weights may be negative; ordered by magnitude, descending. The encoder's own
        weights are a one-pass guess; the least-squares refit is what makes ``q . x_hat``
        close to ``q . x`` (nfcorpus k=128: 0.93x -> 0.99x dense, issue 23)."""
        from scipy.linalg.lapack import spotrf
        if self.w_dec is None or self.centre is None:
            raise ValueError("this projector was saved without its decoder")
        _, dims = self.encode(x, k)
        x = np.ascontiguousarray(x, dtype=np.float32) - self.centre
        k = dims.shape[1]
        vals = np.empty(dims.shape, np.float32)
        gram_all = self._gram()
        for s in range(0, len(x), RECON_CHUNK):
            d = dims[s:s + RECON_CHUNK]
            if gram_all is not None:  # the atoms' Gram matrix, gathered: no k x k x d work
                gram = np.empty((len(d), k, k), np.float32)
                _gather_gram(gram_all, d, gram)
            else:
                atoms = self.w_dec[d]  # (rows, k, d)
                gram = atoms @ atoms.transpose(0, 2, 1)
            for g in gram:  # LAPACK potrf per row: numpy's batched cholesky is 2x slower
                _cholesky_lower(g, spotrf)
            rhs = np.take_along_axis(x[s:s + RECON_CHUNK] @ self.w_dec.T, d, 1)
            _cholesky_solve(gram, rhs, vals[s:s + RECON_CHUNK])
        order = np.lexsort((dims, -np.abs(vals)), axis=1)
        return np.take_along_axis(vals, order, 1), np.take_along_axis(dims, order, 1)

    def _gram(self) -> np.ndarray | None:
        """W_dec W_dec^T (D x D float32), made on first use when D <= GRAM_MAX_DIM (64 MB at
        4,096 latents); above it each document's k x k block is computed from its atoms."""
        if self.dim > GRAM_MAX_DIM:
            return None
        if self._gram_all is None:  # two threads may both make it: same values, one kept
            self._gram_all = self.w_dec @ self.w_dec.T
        return self._gram_all

    def recon_query(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Query latents for ``recon`` scoring: latent j weighs ``w_dec_j . q`` (signed), so the
        sparse dot product with ``encode_recon``'s codes is ``q . (x_hat - centre)``; the k of
        largest magnitude, by magnitude descending (k = D: the exact reconstruction score)."""
        u = self._decoder_weights(q)
        v, part = _top(np.abs(u), u, k, key=np.abs)
        return v, part.astype(np.int32)

    def _decoder_weights(self, q: np.ndarray) -> np.ndarray:
        """``w_dec_j . q`` for every latent j (nq, D)."""
        if self.w_dec is None:
            raise ValueError("this projector was saved without its decoder")
        q = np.ascontiguousarray(q, dtype=np.float32)
        u = np.empty((len(q), self.dim), np.float32)
        _project(self.w_dec, q, u)
        return u

    def save(self, folder: Path, decoder: bool = False) -> list[str]:
        """``decoder``: keep ``w_dec`` too (D x d float32, 6 MB at UHD4096): ``recon`` scoring
        and the levers bench need it; the default scoring does not, so its artifact leaves it."""
        extra = {"w_dec": self.w_dec} if decoder and self.w_dec is not None else {}
        if self.centre is not None:
            extra["centre"] = self.centre
        np.savez(folder / WEIGHTS_FILE, w_enc=self.w_enc, bias=self.bias, balance=self.balance,
                 **extra)
        (folder / META_FILE).write_text(json.dumps(self.meta, indent=1, sort_keys=True))
        return [WEIGHTS_FILE, META_FILE]

    @classmethod
    def load(cls, folder: Path) -> "Projector | None":
        if not (folder / WEIGHTS_FILE).exists():
            return None
        with np.load(folder / WEIGHTS_FILE) as z:
            w_enc, bias = z["w_enc"], z["bias"]
            balance = z["balance"] if "balance" in z.files else None
            w_dec = z["w_dec"] if "w_dec" in z.files else None
            centre = z["centre"] if "centre" in z.files else None
        meta = json.loads((folder / META_FILE).read_text()) if (folder / META_FILE).exists() else {}
        return cls(w_enc, bias, meta, balance, w_dec, centre)


def _neighbours(x: np.ndarray, m: int) -> np.ndarray:
    """Each row's m nearest other rows by inner product (exact, FAISS)."""
    import faiss
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, nb = index.search(x, m + 1)
    # drop the row itself (usually first; duplicates may put it elsewhere)
    out = np.empty((len(x), m), np.int64)
    for i, row in enumerate(nb):
        row = row[(row != i) & (row >= 0)][:m]
        out[i] = np.pad(row, (0, m - len(row)), mode="edge") if len(row) else i
    return out


def train(x: np.ndarray, cfg: TrainConfig) -> Projector:
    """Train a projector on dense embeddings ``x`` (n, d), L2-normalized."""
    import torch
    import torch.nn.functional as F

    t0 = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if len(x) > cfg.max_train:
        x = x[np.sort(rng.choice(len(x), cfg.max_train, replace=False))]
    n, d = x.shape
    big_d, ks = cfg.dim, tuple(sorted(set(min(k, cfg.dim) for k in cfg.ks)))
    k_top, k_main = ks[-1], ks[len(ks) // 2]
    pool = min(cfg.pool, max(n - 1, 0))
    nb = _neighbours(x, pool) if pool else np.zeros((n, 0), np.int64)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        gen = torch.Generator().manual_seed(cfg.seed)
        w = torch.randn(big_d, d, generator=gen)
        w /= w.norm(dim=1, keepdim=True)
        w_dec = w.clone().requires_grad_()
        w_enc = w.clone().requires_grad_()
        b_enc = torch.zeros(big_d, requires_grad=True)
        xt = torch.from_numpy(x)
        b_pre = xt.mean(0).clone().requires_grad_()
        scale = torch.tensor(10.0, requires_grad=True)  # sparse-score logit scale (learned)
        opt = torch.optim.Adam([w_dec, w_enc, b_enc, b_pre, scale], lr=cfg.lr)
        var = float(((xt - xt.mean(0)) ** 2).sum(1).mean()) or 1.0
        idle = torch.zeros(big_d)  # samples since each latent last fired
        balance = torch.zeros(big_d)
        per_step = max(1, min(cfg.anchors, n))
        # an epoch = as many batch rows as training rows (a row comes as an anchor or as a
        # neighbour); small samples still get a few steps per epoch
        steps = max(cfg.min_steps_per_epoch * cfg.epochs,
                    int(np.ceil(cfg.epochs * n / (per_step * (1 + pool)))))
        order = np.concatenate([rng.permutation(n)
                                for _ in range(steps * per_step // n + 1)])
        for step in range(steps):
            a = order[step * per_step:(step + 1) * per_step]
            sel = np.concatenate([a, nb[a].ravel()]) if pool else a
            xb = xt[sel]
            pre = (xb - b_pre) @ w_enc.T + b_enc
            _, idx = (pre.detach() + balance).topk(k_top, dim=1)
            val = F.relu(pre.gather(1, idx))
            if cfg.balance:  # loss-free load balancing: nudge the selection bias of each
                # latent towards the uniform firing rate (k/D), so posting lists stay even
                rate = torch.bincount(idx[:, :k_main].flatten(), minlength=big_d).float()
                balance += cfg.balance * torch.sign(rate.mean() - rate)
            # Multi-TopK reconstruction: decode the prefixes incrementally
            x_hat, lo, rec = b_pre.expand(len(sel), -1), 0, 0.0
            for k in ks:
                x_hat = x_hat + F.embedding_bag(idx[:, lo:k].contiguous(), w_dec,
                                                per_sample_weights=val[:, lo:k].contiguous(),
                                                mode="sum")
                lo = k
                rec = rec + ((xb - x_hat) ** 2).sum(1).mean() / var
                if k == k_main:
                    resid = (xb - x_hat).detach()
            loss = rec / len(ks)
            fired = idx[:, :k_main][val[:, :k_main] > 0].unique()
            idle += len(sel)
            idle[fired] = 0
            dead = idle > cfg.dead_after
            if dead.any():  # AuxK: dead latents reconstruct the residual
                k_aux = min(2 * k_main, int(dead.sum()))
                _, ia = (pre.detach() + balance).masked_fill(~dead, -torch.inf).topk(k_aux, dim=1)
                va = F.relu(pre.gather(1, ia))
                r_hat = F.embedding_bag(ia, w_dec, per_sample_weights=va, mode="sum")
                loss = loss + ((resid - r_hat) ** 2).sum(1).mean() / (
                    (resid ** 2).sum(1).mean() + 1e-12) / 32
            if cfg.w_flops:  # FLOPS: mean activation per latent, squared (cost of postings)
                usage = torch.zeros(big_d).index_add(0, idx[:, :k_main].flatten(),
                                                     val[:, :k_main].flatten()) / len(sel)
                loss = loss + cfg.w_flops * (usage ** 2).sum()
            if cfg.w_contrastive and len(sel) > 1:
                kc = int(ks[rng.integers(len(ks))])
                na = len(a)
                z = torch.zeros(len(sel), big_d).scatter(1, idx[:, :kc], val[:, :kc])
                s_sparse = (z[:na] @ z.T) * scale
                s_dense = xb[:na] @ xb.T
                same = torch.from_numpy(sel[:na, None] == sel[None, :])
                logp = F.log_softmax(s_sparse.masked_fill(same, -1e4), 1)
                target = F.softmax(s_dense.masked_fill(same, -1e4) / cfg.tau, 1)
                loss = loss + cfg.w_contrastive * F.kl_div(logp, target, reduction="batchmean")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                w_dec /= w_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
            if step % 50 == 0 or step == steps - 1:
                cfg.log.append({"step": step, "loss": round(float(loss.detach()), 5),
                                "dead": int(dead.sum()), "s": round(time.perf_counter() - t0, 1)})
        w_np = w_enc.detach().numpy().copy()
        bias = (b_enc.detach() - w_enc.detach() @ b_pre.detach()).numpy().copy()
        balance = balance.numpy().copy()
    finally:
        torch.set_num_threads(prev_threads)
    meta = {"dim": big_d, "in_dim": d, "ks": list(ks), "seed": cfg.seed, "epochs": cfg.epochs,
            "train_rows": n, "steps": steps, "seconds": round(time.perf_counter() - t0, 2),
            "pool": pool, "tau": cfg.tau, "w_flops": cfg.w_flops, "balance": cfg.balance, "threads": cfg.threads,
            "log": cfg.log[-5:]}
    return Projector(w_np, bias, meta, balance, w_dec.detach().numpy().copy(), x.mean(0))
