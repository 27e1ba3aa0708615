"""The multivector codebook's training (issue 39: minutes -> seconds): the collection-sized K,
determinism, and the numpy OPQ's rotation (orthonormal, and it helps where PQ alone is poor)."""
from __future__ import annotations

import numpy as np
import pytest

from polyindex.index.multivector import codec


def tokens(n=4000, d=32, seed=0):
    """Unit vectors whose variance sits in a few directions (as token embeddings' does)."""
    rng = np.random.default_rng(seed)
    scale = np.geomspace(3.0, 0.05, d)
    x = rng.standard_normal((n, d)) * scale @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mse(cb, x):
    codes = cb.assign(x)
    return float(((x - cb.decode(codes, cb.residual_codes(x, codes))) ** 2).sum(1).mean())


def test_codebook_size_follows_plaid_and_the_cap():
    assert codec.codebook_size(4096, 194_222) == 4096  # medline: 16 sqrt(n) = 7,051 -> 4,096
    assert codec.codebook_size(4096, 6_052) == 1024  # adi
    assert codec.codebook_size(4096, 5_000_000) == 4096  # the K asked caps it
    assert codec.codebook_size(64, 40) == 10  # a quarter of the tokens
    assert codec.codebook_size(4096, 3) == 2


def test_training_is_deterministic_for_a_seed_and_records_what_it_did():
    x = tokens()
    a = codec.train(x, 64, 8, seed=3, opq=True)
    b = codec.train(x, 64, 8, seed=3, opq=True)
    assert np.array_equal(a.centroids, b.centroids)
    assert np.array_equal(a.rotation, b.rotation)
    assert np.array_equal(a.pq_centroids, b.pq_centroids)
    assert a.meta["k"] == 64 and a.meta["niter"] == 4 and a.meta["tokens_seen"] == len(x)
    c = codec.train(x, 64, 8, seed=4, opq=True)
    assert not np.array_equal(a.centroids, c.centroids)


@pytest.mark.slow
def test_opq_rotation_is_orthonormal_and_beats_plain_pq_on_uneven_variance():
    both = tokens(5000)  # one distribution (one basis): train on 4,000, measure on the rest
    x, held = both[:4000], both[4000:]
    opq = codec.train(x, 16, 4, opq=True)
    pq = codec.train(x, 16, 4, opq=False)
    r = opq.rotation
    assert r.shape == (32, 32)
    assert np.allclose(r @ r.T, np.eye(32), atol=1e-4)
    assert mse(opq, held) < 0.9 * mse(pq, held)
    # a reduction (OPQ4_16): orthonormal rows, still a usable reconstruction
    red = codec.train(x, 16, 4, opq=True, opq_dim=16)
    assert red.rotation.shape == (16, 32)
    assert np.allclose(red.rotation @ red.rotation.T, np.eye(16), atol=1e-4)
    codes_only = codec.train(x, 16, 0)
    assert mse(red, held) < ((held - codes_only.centroids[codes_only.assign(held)]) ** 2).sum(1).mean()


def test_residual_codes_are_faiss_product_quantizer_codes():
    """The numba encoder (issue 39 part 1: 2.3x less CPU) gives the codes faiss's
    ProductQuantizer.compute_codes gives for the same sub-centroids."""
    import faiss
    x = tokens(3000, 64, seed=5)
    cb = codec.train(x, 32, 8, seed=0, opq=True)
    codes = cb.assign(x)
    pq = faiss.ProductQuantizer(cb.d_res, cb.m, 8)
    faiss.copy_array_to_vector(cb.pq_centroids.ravel(), pq.centroids)
    want = pq.compute_codes(cb._rotate(np.ascontiguousarray(x - cb.centroids[codes])))
    assert np.array_equal(cb.residual_codes(x, codes), want)


def test_chunked_build_work_gives_the_single_call_results(monkeypatch):
    """Assignment, residual codes and scales in small chunks over the build threads equal one
    call over every row (a row's result does not depend on its chunk)."""
    x = tokens(2500, 32, seed=6)
    cb = codec.train(x, 64, 8, seed=0, opq=True)
    ct, half = cb._centroids_t()
    whole = (x @ ct - half).argmax(1)
    codes = cb.assign(x)
    res, scale = cb.residual_codes(x, codes), cb.scales(x, codes, cb.residual_codes(x, codes))
    monkeypatch.setattr(codec, "ASSIGN_ROWS", 97)  # 26 chunks over the threads
    monkeypatch.setattr(codec.os, "cpu_count", lambda: 4)
    assert np.array_equal(codes, whole)
    assert np.array_equal(cb.assign(x), codes)
    assert np.array_equal(cb.residual_codes(x, codes), res)
    assert np.array_equal(cb.scales(x, codes, res).view(np.uint16), scale.view(np.uint16))
