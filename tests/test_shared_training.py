"""A collection's trained artifacts come from its first batch, whatever the segmentation
(``storage.shared_training``, issue 43 part 1): an online writer trains at its first upsert,
before any seal, and its answers equal an embedded collection given the same batches; shipped
artifacts are installed only where a collection has none, and a bad shipped name is refused.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from polyindex.engine import Engine
from polyindex.errors import Corrupt
from polyindex.storage.shared_training import export, install

KINDS = ["lexical", "dense:dim=16,IVF4,Flat"]


def _docs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    words = [f"w{i}" for i in range(50)]
    return [{"id": f"d{i}", "text": " ".join(rng.choice(words, 8)), "vector": x[i]}
            for i in range(n)]


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_an_online_writer_trains_on_its_first_batch_and_answers_as_one_segment(tmp_path):
    docs = _docs(400)
    with Engine(tmp_path / "online", online=True) as eng:
        coll = eng.create_collection("c", KINDS, model=None)
        coll.add(docs[:200])
        # committed before the first seal: the template is the first batch's, not the seal's
        arts = _manifest(tmp_path / "online" / "c")["artifacts"]
        assert arts.get("dense") == ["dense.template.faiss"], arts
        coll.add(docs[200:300])
        coll.seal()  # segments of 300 and 100 rows (the embedded one: 200 and 200)
        coll.add(docs[300:])
        coll.delete([f"d{i}" for i in range(0, 400, 17)])
        coll.seal()
        q = np.stack([d["vector"] for d in _docs(8, seed=1)])
        got = coll.query_batch(vectors=list(q), k=10, profile="dense")
        sizes = sorted(s.docs.n_rows for s in coll.view().segments)
    with Engine(tmp_path / "embedded") as eng:  # two batches, two segments
        ref = eng.create_collection("c", KINDS, model=None)
        ref.add(docs[:200])
        ref.add(docs[200:])
        ref.delete([f"d{i}" for i in range(0, 400, 17)])
        want = ref.query_batch(vectors=list(q), k=10, profile="dense")
    assert len(sizes) == 2 and sizes[1] == 300  # not the embedded segments (200, 200)
    assert [[h.id for h in x] for x in got] == [[h.id for h in x] for x in want]
    np.testing.assert_allclose([[h.score for h in x] for x in got],
                               [[h.score for h in x] for x in want], rtol=1e-5)
    ours = (tmp_path / "online" / "c" / "artifacts" / "dense" / "dense.template.faiss")
    theirs = (tmp_path / "embedded" / "c" / "artifacts" / "dense" / "dense.template.faiss")
    assert ours.read_bytes() == theirs.read_bytes()


def test_install_keeps_a_collections_own_artifacts_and_refuses_bad_names(tmp_path):
    with Engine(tmp_path / "a") as eng:
        a = eng.create_collection("c", KINDS, model=None)
        a.add(_docs(200))
        blobs = export(a.table)
        assert set(blobs) == {"dense"} and blobs["dense"]["dense.template.faiss"]
        with Engine(tmp_path / "b") as eng_b:
            b = eng_b.create_collection("c", KINDS, model=None)
            with pytest.raises(Corrupt, match="bad file name"):
                install(b.table, {"dense": {"../x": b"1"}})
            assert install(b.table, blobs) == ["dense"]
            assert not b.table.kinds["dense"].needs_training()
            assert install(b.table, blobs) == []  # has one now: kept
            b.add(_docs(50, seed=3))
            assert export(b.table) == blobs
        with Engine(tmp_path / "c") as eng_c:  # trained its own first: never replaced
            c = eng_c.create_collection("c", KINDS, model=None)
            c.add(_docs(200, seed=5))
            own = export(c.table)
            assert install(c.table, blobs) == []
            assert export(c.table) == own != blobs


def test_a_multivector_codebook_waits_for_a_first_batch_with_enough_tokens(tmp_path):
    """The codebook is sized to what it trains on: an online writer's first upsert of a few
    tokens does not fix it (the first seal trains it, as before); a first batch of at least
    ``SHARED_MIN_TOKENS`` tokens does, before any seal."""
    from polyindex.index.multivector.kind import SHARED_MIN_TOKENS
    rng = np.random.default_rng(5)

    def docs(lo, n, per):
        return [{"id": f"d{i}", "text": f"t{i}", "tokens": rng.normal(size=(per, 8)).astype(
            np.float32)} for i in range(lo, lo + n)]
    mv = "multivector:KMeans8,residual=none,source=user,dim=8"
    with Engine(tmp_path / "e", online=True) as eng:
        small = eng.create_collection("small", ["lexical", mv], model=None)
        small.add(docs(0, 2, 10))  # 20 tokens
        assert not _manifest(tmp_path / "e" / "small")["artifacts"].get("multivector")
        small.add(docs(2, 40, 10))
        small.seal()  # the seal trains it, on what was buffered
        assert _manifest(tmp_path / "e" / "small")["artifacts"].get("multivector")
        assert len(small.query(tokens=rng.normal(size=(3, 8)).astype(np.float32), k=5)) == 5
        big = eng.create_collection("big", ["lexical", mv], model=None)
        big.add(docs(0, SHARED_MIN_TOKENS // 16, 16))
        assert _manifest(tmp_path / "e" / "big")["artifacts"].get("multivector")
