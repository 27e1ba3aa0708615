"""One forward pass per query (issue 39 part 1): whatever profile runs, a query text goes
through the model once (``hybrid-mv`` used to encode it twice: dense, then tokens), and the
dense vector of that shared pass is the plain encoder's. Real model, real indexes."""
import numpy as np
import pytest

import polyindex
from polyindex.encode.tokens import token_encoder_for

WORDS = ("wing shock wave boundary layer laminar flow supersonic pressure heat transfer plate "
         "cylinder turbulent nozzle jet mach number drag lift blade vortex").split()


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("one_pass")
    rng = np.random.default_rng(3)
    docs = [{"_id": f"d{i}", "title": f"t{i}", "text": " ".join(rng.choice(WORDS, 20))}
            for i in range(48)]
    eng = polyindex.open(tmp_path)
    c = eng.create_collection("c", ["lexical", "dense", "multivector:KMeans16,residual=PQ8"],
                              dtype="float32")
    c.add(docs)
    yield c
    eng.close()


def count_passes(model):
    """Counts the model's forward passes (every encode path calls ``model.forward``)."""
    calls = []
    inner = model.forward

    def forward(*a, **kw):
        calls.append(1)
        return inner(*a, **kw)
    model.forward = forward
    return calls


@pytest.mark.parametrize("batch", [1, 3])
def test_every_profile_encodes_a_query_once(coll, batch):
    model = coll.encoder.model
    calls = count_passes(model)
    texts = ["supersonic shock wave on a wing", "heat transfer of a plate", "nozzle jet"][:batch]
    try:
        for name in sorted(coll.profiles()):
            calls.clear()
            coll.query_batch(texts, k=5, profile=name)
            neural = name not in ("lexical", "lexical-prf")
            assert len(calls) == (1 if neural else 0), (name, len(calls))
    finally:
        del model.forward  # the instance attribute: back to the class's method


def test_shared_pass_gives_the_plain_dense_vector(coll):
    texts = ["laminar boundary layer on a flat plate", "drag"]
    vecs, toks = token_encoder_for(coll.encoder).encode_queries_both(texts)
    plain = coll.encoder.encode(texts)
    cos = (vecs * plain).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(plain, axis=1)
    assert cos.min() > 0.99999
    assert [len(t.vectors) for t in toks] == [len(t.vectors) for t in
                                              token_encoder_for(coll.encoder).encode_queries(texts)]


def test_hybrid_mv_hits_unchanged_by_the_shared_pass(coll):
    """The tokens handed over by the shared pass give the hits the kind's own encode gave."""
    text = "turbulent vortex behind a blade"
    shared = coll.query(text, k=10, profile="multivector")
    from polyindex.index.protocol import Query
    snap = coll.view()
    kind = coll.kinds["multivector"]
    segs = [s.indexes["multivector"] for s in snap.segments]
    prep = kind.prepare([Query(text=text)], segs, snap.live, {}, {})  # the kind encodes
    s, keys = kind.search_snapshot(prep, segs, snap.bases, 10, {}, [None] * len(segs))
    np.testing.assert_allclose([h.score for h in shared], s[0][:len(shared)], rtol=1e-6)
