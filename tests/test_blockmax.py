"""Block-max MaxScore (dynamic pruning for lexical top-k): the same answer as term-at-a-time."""
from __future__ import annotations

import json

import numpy as np
import pytest

from polyindex.errors import Corrupt
from polyindex.index import blockmax, postings
from polyindex.index.lexical import BLOCKS_FILE, LexicalKind
from polyindex.index.protocol import BuildBatch, Query


def zipf_segment(rng, n: int, vocab: int, max_len: int = 40):
    """CSR postings of n rows of Zipf words (lengths vary, so length bounds matter)."""
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    lens = rng.integers(1, max_len + 1, n)
    flat = rng.choice(vocab, size=int(lens.sum()), p=p)
    offsets, docs, tfs = postings.build_csr(flat, np.repeat(np.arange(n), lens), None, vocab)
    return offsets, docs, tfs, lens.astype(np.int32)


def both(seg, ptr, terms, weights, k, k1, b, avgdl, allow, always=True):
    """(term-at-a-time, block-max) answers; ``always``: prune every query, not only those
    ``blockmax.pays`` picks."""
    offsets, docs, tfs, doclen = seg
    has = allow is not None
    mask = allow if has else postings._NO_ALLOW
    nq = len(ptr) - 1
    taat = (np.empty((nq, k), np.float32), np.empty((nq, k), np.int64))
    postings.bm25_search(offsets, docs, tfs, doclen, ptr, terms, weights, k1, b, avgdl, has,
                         mask, *postings.BufferPool(len(doclen)).get(), *taat)
    blocks = (blockmax.block_offsets(offsets), *blockmax.build_blocks(offsets, docs, tfs, doclen))
    pruned = (np.empty((nq, k), np.float32), np.empty((nq, k), np.int64))
    blockmax.bm25_search(offsets, docs, tfs, doclen, *blocks, ptr, terms, weights, k1, b, avgdl,
                         always, has, mask, *postings.BufferPool(len(doclen)).get(), *pruned)
    return taat, pruned


@pytest.mark.parametrize("seed", range(6))
def test_same_rows_order_and_score_bits_as_term_at_a_time(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n, vocab = int(rng.integers(1, 4000)), int(rng.integers(2, 400))
        seg = zipf_segment(rng, n, vocab)
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
        allow = rng.random(n) < 0.6 if rng.random() < 0.4 else None
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


def _build(tmp_path, texts):
    kind = LexicalKind("")
    info = kind.build(BuildBatch(ids=[str(i) for i in range(len(texts))],
                                 titles=[""] * len(texts), texts=texts), tmp_path)
    return kind, json.loads(json.dumps(info))


@pytest.mark.parametrize("variant", ["bm25", "lucene", "robertson", "atire", "bm25+", "bm25l"])
def test_segments_with_and_without_blocks_answer_alike(tmp_path, variant):
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(300)]
    p = 1.0 / np.arange(1, 301)
    p /= p.sum()
    texts = [" ".join(rng.choice(words, int(rng.integers(3, 60)), p=p)) for _ in range(3000)]
    kind, info = _build(tmp_path, texts)
    assert BLOCKS_FILE in info["files"] and (tmp_path / BLOCKS_FILE).exists()
    with_blocks = kind.open(tmp_path, info)
    old = dict(info, files=[f for f in info["files"] if f != BLOCKS_FILE])
    without = kind.open(tmp_path, old)  # a segment written before the file existed
    assert with_blocks.blocks is not None and without.blocks is None
    queries = [Query(text=" ".join(rng.choice(words, 3))) for _ in range(40)]
    for seg in (with_blocks, without):
        prep = kind.prepare(queries, [seg], [None], {"variant": variant}, {})
        for k in (1, 10, 500):
            got = seg.search(prep, k, {"variant": variant}, None)
            if seg is with_blocks:
                ref = without.search(prep, k, {"variant": variant}, None)
                np.testing.assert_array_equal(got[1], ref[1])
                np.testing.assert_array_equal(got[0], ref[0])


def test_a_blocks_file_that_disagrees_is_corrupt(tmp_path):
    kind, info = _build(tmp_path, [f"a b c w{i}" for i in range(500)])
    postings.write_arrow(tmp_path / BLOCKS_FILE, {"last": np.zeros(1, np.int32),
                                                  "max_tf": np.zeros(1, np.int32),
                                                  "min_len": np.zeros(1, np.int32)})
    with pytest.raises(Corrupt, match="blocks"):
        kind.open(tmp_path, info)


def test_term_frequencies_are_stored_narrow_and_old_int32_files_still_score_alike(tmp_path):
    import pyarrow as pa

    from polyindex.index.lexical import POSTINGS_FILE
    texts = ["apple " * 300 + "pear", "apple pear pear", "plum"] + [f"w{i} apple" for i in range(50)]
    kind, info = _build(tmp_path, texts)
    seg = kind.open(tmp_path, info)
    assert seg.tfs.dtype == np.uint16 and seg.tfs.max() == 300  # one count over 255
    queries = [Query(text="apple pear"), Query(text="plum apple")]
    prep = kind.prepare(queries, [seg], [None], {}, {})
    want = seg.search(prep, 5, {}, None)
    assert 0 in want[1][0]  # the document with tf 300
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / POSTINGS_FILE))).read_all()
    old = pa.table({"doc": table.column("doc"), "tf": table.column("tf").cast(pa.int32())})
    del seg, prep, table
    (tmp_path / POSTINGS_FILE).unlink()
    with pa.OSFile(str(tmp_path / POSTINGS_FILE), "wb") as sink, \
            pa.ipc.new_file(sink, old.schema) as writer:
        writer.write_table(old)
    seg = kind.open(tmp_path, info)
    assert seg.tfs.dtype == np.int32
    got = seg.search(kind.prepare(queries, [seg], [None], {}, {}), 5, {}, None)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    kind, info = _build(tmp_path / "small", ["a b a", "b c"])
    assert kind.open(tmp_path / "small", info).tfs.dtype == np.uint8
