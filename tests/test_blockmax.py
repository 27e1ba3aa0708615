"""Block-max MaxScore (dynamic pruning for lexical top-k): the same answer as term-at-a-time."""
from __future__ import annotations

import json

import numpy as np
import pytest

from polyindex.errors import Corrupt
from polyindex.index import docids, postings
from polyindex.index.lexical import blockmax
from polyindex.index.lexical.kind import BLOCKS_FILE, POSTINGS_FILE, WIDE_FILE, LexicalKind
from polyindex.index.protocol import BuildBatch, Query


def zipf_segment(rng, n: int, vocab: int, max_len: int = 40, stride: int = 1):
    """CSR postings of n rows of Zipf words (lengths vary, so length bounds matter); with
    ``stride`` the words sit on every stride-th row of n * stride (empty rows between), so
    blocks span past 2^16 rows and cross its multiples."""
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    lens = rng.integers(1, max_len + 1, n)
    flat = rng.choice(vocab, size=int(lens.sum()), p=p)
    rows = np.repeat(np.arange(n) * stride, lens)
    offsets, docs, tfs = postings.build_csr(flat, rows, None, vocab)
    doclen = np.zeros(n * stride, np.int32)
    doclen[np.arange(n) * stride] = lens
    return offsets, docs, tfs, doclen


def both(seg, ptr, terms, weights, k, k1, b, avgdl, allow, always=True):
    """(term-at-a-time, block-max) answers; ``always``: prune every query, not only those
    ``blockmax.pays`` picks."""
    offsets, docs, tfs, doclen = seg
    has = allow is not None
    mask = allow if has else postings._NO_ALLOW
    nq = len(ptr) - 1
    taat = (np.empty((nq, k), np.float32), np.empty((nq, k), np.int64))
    plain = docids.legacy(offsets, docs)  # int32 rows, as segments written before
    postings.bm25_search(offsets, plain, tfs, doclen, ptr, terms, weights, k1, b, avgdl, has,
                         mask, *postings.BufferPool(len(doclen)).get(), *taat)
    compact = (docids.block_offsets(offsets), *docids.encode(offsets, docs), docids.SHIFT)
    blocks = blockmax.build_blocks(offsets, docs, tfs, doclen)
    pruned = blockmax.search(offsets, compact, tfs, doclen, blocks, ptr, terms, weights, k1, b,
                             avgdl, postings.BufferPool(len(doclen)), k, allow, always=always)
    return taat, pruned


@pytest.mark.parametrize("seed", range(6))
def test_same_rows_order_and_score_bits_as_term_at_a_time(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n, vocab = int(rng.integers(1, 4000)), int(rng.integers(2, 400))
        seg = zipf_segment(rng, n, vocab, stride=int(rng.choice([1, 1, 7, 300])))
        df = np.diff(seg[0])
        ptr, terms, weights = [0], [], []
        for _q in range(4):
            present = np.flatnonzero(df)
            chosen = rng.choice(present, size=min(len(present), int(rng.integers(1, 7))),
                                replace=False)
            terms += chosen.tolist()
            w = rng.uniform(0.05, 6.0, len(chosen))
            weights += (np.round(w) + 1.0 if rng.random() < 0.3 else w).tolist()  # ties
            ptr.append(len(terms))
        k = int(rng.choice([1, 2, 10, 100, 1000, 10_000]))
        k1, b = float(rng.choice([0.0, 0.9, 1.5])), float(rng.choice([0.0, 0.4, 0.75, 1.0]))
        allow = rng.random(len(seg[3])) < 0.6 if rng.random() < 0.4 else None
        (s1, r1), (s2, r2) = both(seg, np.array(ptr, np.int64), np.array(terms, np.int64),
                                  np.array(weights), k, k1, b, float(rng.uniform(5, 30)), allow)
        np.testing.assert_array_equal(r2, r1)
        np.testing.assert_array_equal(s2.view(np.int32), s1.view(np.int32))


def test_the_policy_prunes_queries_dominated_by_a_frequent_term():
    # One rare term in 1 row of 100,000, one term in every row: the frequent list dwarfs the
    # other, so ``pays`` picks pruning; the top-1 (the row with both) must be the same.
    n = 100_000
    flat = np.concatenate([np.ones(n, np.int64), [0], np.full(n // 2, 2), np.full(n // 2, 3)])
    rows = np.concatenate([np.arange(n), [77_777], np.arange(n // 2), np.arange(n // 2)])
    offsets, docs, tfs = postings.build_csr(flat, rows, None, 4)
    assert blockmax.pays(offsets, np.array([0, 1]), 3)
    assert not blockmax.pays(offsets, np.array([0, 1]), 1000)  # k too large
    assert not blockmax.pays(offsets, np.array([2, 3]), 3)  # two lists of equal length
    assert not blockmax.pays(offsets, np.array([0]), 3)  # under MIN_POSTINGS
    seg = (offsets, docs, tfs, np.full(n, 10, np.int32))
    for terms in ([0, 1], [2, 3], [0, 1, 2]):
        (s1, r1), (s2, r2) = both(seg, np.array([0, len(terms)], np.int64),
                                  np.array(terms, np.int64), np.linspace(10.0, 0.1, len(terms)),
                                  3, 1.5, 0.75, 10.0, None, always=False)
        np.testing.assert_array_equal(r2, r1)
        np.testing.assert_array_equal(s2, s1)
        if terms == [0, 1]:
            assert r2[0, 0] == 77_777
    # one batch mixing pruned and term-at-a-time queries: each answer lands in its own row
    batch = [[2, 3], [0, 1], [0, 1, 2], [3]]
    ptr = np.concatenate([[0], np.cumsum([len(t) for t in batch])]).astype(np.int64)
    terms = np.array([t for ts in batch for t in ts], np.int64)
    weights = np.linspace(5.0, 0.2, len(terms))
    assert blockmax.pruned_queries(offsets, ptr, terms, 3).tolist() == [False, True, False, True]
    (s1, r1), (s2, r2) = both(seg, ptr, terms, weights, 3, 1.5, 0.75, 10.0, None, always=False)
    np.testing.assert_array_equal(r2, r1)
    np.testing.assert_array_equal(s2, s1)


def _build(tmp_path, texts):
    kind = LexicalKind("")
    info = kind.build(BuildBatch(ids=[str(i) for i in range(len(texts))],
                                 titles=[""] * len(texts), texts=texts), tmp_path)
    return kind, json.loads(json.dumps(info))


@pytest.mark.parametrize("variant", ["bm25", "lucene", "robertson", "atire", "bm25+", "bm25l"])
def test_pruned_and_term_at_a_time_answer_alike_through_the_kind(tmp_path, variant,
                                                                   monkeypatch):
    from polyindex.index.lexical import kind as lexical
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(300)]
    p = 1.0 / np.arange(1, 301)
    p /= p.sum()
    texts = [" ".join(rng.choice(words, int(rng.integers(3, 60)), p=p)) for _ in range(3000)]
    kind, info = _build(tmp_path, texts)
    assert BLOCKS_FILE in info["files"] and (tmp_path / BLOCKS_FILE).exists()
    seg = kind.open(tmp_path, info)
    assert seg.blocks is not None
    queries = [Query(text=" ".join(rng.choice(words, 3))) for _ in range(40)]
    prep = kind.prepare(queries, [seg], [None], {"variant": variant}, {})
    for k in (1, 10, 500):
        monkeypatch.setattr(lexical, "BLOCKMAX", False)
        ref = seg.search(prep, k, {"variant": variant}, None)
        monkeypatch.setattr(lexical, "BLOCKMAX", True)
        got = seg.search(prep, k, {"variant": variant}, None)
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_array_equal(got[0], ref[0])


def test_a_blocks_file_that_disagrees_is_corrupt(tmp_path):
    kind, info = _build(tmp_path, [f"a b c w{i}" for i in range(500)])
    postings.write_arrow(tmp_path / BLOCKS_FILE, {"last": np.zeros(1, np.int32),
                                                  "max_tf": np.zeros(1, np.int32),
                                                  "min_len": np.zeros(1, np.int32)})
    with pytest.raises(Corrupt, match="blocks"):
        kind.open(tmp_path, info)


def test_doc_ids_round_trip_narrow_wide_and_across_multiples_of_2_16():
    rng = np.random.default_rng(5)
    share_wide = {}
    for stride in (1, 3, 200, 5000):
        offsets, docs, _, _ = zipf_segment(rng, 3000, 50, stride=stride)
        P = (docids.block_offsets(offsets), *docids.encode(offsets, docs), docids.SHIFT)
        np.testing.assert_array_equal(docids.decode(P, offsets), docs)
        assert docids.blocks_valid(P, offsets, 3000 * stride)
        share_wide[stride] = (P[2] >= 0).mean()
        for t in range(len(offsets) - 1):  # random access (binary search) agrees with numpy
            run = docs[offsets[t]:offsets[t + 1]]
            for row in rng.integers(0, 3000 * stride, 5):
                got = docids.find(P, offsets, t, row, offsets[t], offsets[t + 1])
                assert got - offsets[t] == np.searchsorted(run, row)
    # 3,000 rows: every block narrow; the wider the rows are spread, the more blocks wide
    assert share_wide[1] == share_wide[3] == 0 < share_wide[200] < share_wide[5000] < 1
    narrow = int(np.flatnonzero(P[2] < 0)[0])
    first = P[1].copy()
    first[narrow] = 3000 * 5000  # a first row past the segment
    assert not docids.blocks_valid((P[0], first, *P[2:]), offsets, 3000 * 5000)
    assert not docids.blocks_valid((*P[:5], 0), offsets, 3000 * 5000)  # not the 16-bit layout
    wide_at = P[2].copy()
    wide_at[int(np.flatnonzero(P[2] >= 0)[-1])] = len(P[4]) - 1  # a run past the wide array
    assert not docids.blocks_valid((P[0], P[1], wide_at, *P[3:]), offsets, 3000 * 5000)


def test_segments_written_with_int32_rows_and_counts_still_open_and_score_alike(tmp_path):
    import pyarrow as pa
    texts = ["apple " * 300 + "pear", "apple pear pear", "plum"] + [f"w{i} apple"
                                                                   for i in range(50)]
    kind, info = _build(tmp_path, texts)
    seg = kind.open(tmp_path, info)
    assert seg.tfs.dtype == np.uint16 and seg.tfs.max() == 300  # one count over 255
    queries = [Query(text="apple pear"), Query(text="plum apple")]
    prep = kind.prepare(queries, [seg], [None], {}, {})
    want = seg.search(prep, 5, {}, None), seg.score(prep, np.arange(5))
    assert 0 in want[0][1][0]  # the document with tf 300
    rows = docids.decode(seg.P, seg.offsets)
    old = pa.table({"doc": pa.array(rows, pa.int32()), "tf": pa.array(seg.tfs, pa.int32())})
    del seg, prep
    (tmp_path / POSTINGS_FILE).unlink()
    (tmp_path / WIDE_FILE).unlink()
    postings.write_arrow(tmp_path / POSTINGS_FILE, {"doc": old.column("doc").chunk(0),
                                                    "tf": old.column("tf").chunk(0)})
    for files in ([f for f in info["files"] if f != WIDE_FILE],  # bounds kept
                  [f for f in info["files"] if f not in (WIDE_FILE, BLOCKS_FILE)]):
        seg = kind.open(tmp_path, dict(info, files=files))
        assert seg.tfs.dtype == np.int32 and (seg.blocks is None) == (BLOCKS_FILE not in files)
        prep = kind.prepare(queries, [seg], [None], {}, {})
        got = seg.search(prep, 5, {}, None), seg.score(prep, np.arange(5))
        np.testing.assert_array_equal(got[0][1], want[0][1])
        np.testing.assert_array_equal(got[0][0], want[0][0])
        np.testing.assert_array_equal(got[1], want[1])
    kind, info = _build(tmp_path / "small", ["a b a", "b c"])
    assert kind.open(tmp_path / "small", info).tfs.dtype == np.uint8


def test_a_wide_segment_or_a_live_mask_of_any_origin_needs_no_new_compile(tmp_path):
    """Numba compiles a kernel once per argument type, and a read-only array (a mapped file)
    is another type than a writable one: a segment past 2^16 rows (its wide rows mapped
    from a file) or a live mask made in memory must reuse what a small segment compiled,
    or the first query to meet one stops for the compile (3.3-3.9 s in bench_living)."""
    from polyindex.index.lexical import vocabulary
    texts = [f"apple w{i % 97}" + (" rare" if i % 600 == 0 else "") for i in range(70_000)]
    kind, info = _build(tmp_path / "narrow", texts[:20_000])
    narrow = kind.open(tmp_path / "narrow", info)
    kind, info = _build(tmp_path / "wide", texts)
    wide = kind.open(tmp_path / "wide", info)
    assert len(wide.P[4]) > 0 == len(narrow.P[4])  # only the big one has wide blocks
    queries = [Query(text="apple w3"), Query(text="rare w5")]  # pruned, term-at-a-time
    kernels = (postings.bm25_search, blockmax.bm25_search, vocabulary.add_doc_freqs)

    def search(seg, masks):
        for mask in masks:
            prep = kind.prepare(queries, [seg], [mask], {}, {})
            got = seg.search(prep, 10, {}, mask)
            assert (got[1] >= 0).all()

    live = np.ones(wide.n_rows, np.bool_)
    live[::7] = False
    mapped = live.copy()
    mapped.flags.writeable = False  # as a mask read from a file
    search(narrow, [None, live[:20_000], mapped[:20_000]])
    compiled = [set(k.signatures) for k in kernels]
    search(wide, [None, live, mapped])
    assert [set(k.signatures) for k in kernels] == compiled
