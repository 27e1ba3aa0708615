"""Equal scores are ordered by id, however many tie (the Arrow path) and however the
documents fell into segments."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

import polyindex
from polyindex.index.ties import ARROW_TIES, order_ties


def test_arrow_and_python_paths_order_ties_alike():
    rng = np.random.default_rng(0)
    n = 3 * ARROW_TIES
    names = np.array([f"{w}{i}" for i, w in enumerate(rng.choice(
        ["b", "a", "é", "Z", "ab", "日本", "a-", "z"], n))], dtype=object)
    keys = rng.permutation(n).astype(np.int64).reshape(1, -1)
    scores = np.sort(rng.integers(0, 4, n).astype(np.float32))[::-1].reshape(1, -1)
    keys[0, -3:] = -1  # padding never moves
    ids_of = lambda k: names[k].tolist()  # noqa: E731
    python = order_ties(scores, keys, ids_of)
    arrow = order_ties(scores, keys, ids_of, lambda k: pa.array(names[k].tolist(), pa.string()))
    np.testing.assert_array_equal(arrow, python)
    np.testing.assert_array_equal(arrow[0, -3:], [-1, -1, -1])
    for s in np.unique(scores[0, :-3]):
        run = arrow[0, :-3][scores[0, :-3] == s]
        assert names[run].tolist() == sorted(names[run].tolist())


def test_many_ties_in_one_or_three_segments_give_one_order(tmp_path):
    # 300 documents with the same text tie on every lexical query: 300 ids in id order (all
    # of them: which members of a run cut by k are kept still follows rows)
    docs = [{"id": f"doc-{(i * 7919) % 1000:03d}", "text": "same words here"}
            for i in range(300)]
    out = []
    for name, chunks in (("one", [docs]), ("three", [docs[:90], docs[90:200], docs[200:]])):
        with polyindex.open(tmp_path / name) as eng:
            coll = eng.create_collection("c", ["lexical"], model=None)
            for chunk in chunks:
                coll.add(chunk)
            assert len(coll.view().segments) == len(chunks)
            out.append([h.id for h in coll.query("same words", k=300, profile="lexical")])
    assert out[0] == out[1] == sorted(d["id"] for d in docs)
