"""Document quality at ingest and pruning by it (issue 21 part 4): the ``_quality`` column is
stored and carried through merges; ``--prune-quality P`` keeps the lowest-quality fraction out
of the costly indexes (not encoded), while a pruned document is still stored, returned by
``get`` and found by lexical queries; segmentation does not change what is pruned or found;
a bad P commits nothing."""
import json
import math
import random

import numpy as np
import pytest
from typer.testing import CliRunner

import polyindex
from polyindex.cli.main import app
from polyindex.errors import Corrupt, InvalidArgument

WORDS = ("wing flutter boundary layer heat transfer shock wave pressure lift drag supersonic "
         "nozzle turbulent laminar flow").split()
N = 40
P = 0.25
KINDS = ["lexical", "dense", "sparse:UHD4096,k=16,k_query=8,rescore=0,epochs=2", "tree:branch=4,leaf=8"]


def write_source(path, n=N, seed=1):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            body = " ".join(rnd.choice(WORDS[: rnd.randint(2, len(WORDS))])
                            for _ in range(rnd.randint(3, 40)))
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": f"{body} tag{i}"}) + "\n")
    return path


def build(tmp, name, segment_size, kinds=KINDS, prune=P):
    src = write_source(tmp / "src.jsonl")
    c = polyindex.open(tmp / "data").create_collection(name, kinds, dtype="float32",
                                                       segment_size=segment_size)
    c.index(src, prune_quality=prune)
    return c


@pytest.fixture(scope="module")
def several(tmp_path_factory):
    return build(tmp_path_factory.mktemp("several"), "several", 15)


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    return build(tmp_path_factory.mktemp("one"), "one", 1000)


def by_id(coll, column):
    out = {}
    for seg in coll.table.sealed_snapshot().segments:
        vals = seg.docs.quality() if column == "quality" else (
            np.zeros(seg.docs.n_rows, bool) if seg.docs.pruned() is None else seg.docs.pruned())
        out.update(zip(seg.docs.ids.tolist(), vals.tolist()))
    return out


def pruned_ids(coll):
    return {i for i, p in by_id(coll, "pruned").items() if p}


def test_quality_column_is_stored_and_survives_compaction(tmp_path):
    c = build(tmp_path, "q", 15)
    before_q, before_p = by_id(c, "quality"), pruned_ids(c)
    assert len(c.table.sealed_snapshot().segments) == 3
    assert len(before_q) == N and all(0 < q < 1 for q in before_q.values())
    c.compact(max_segments=1)
    assert len(c.table.sealed_snapshot().segments) == 1
    assert by_id(c, "quality") == before_q
    assert pruned_ids(c) == before_p
    seg = c.table.sealed_snapshot().segments[0]
    assert seg.indexes["dense"].presence is not None
    assert int((~seg.indexes["dense"].presence.mask).sum()) == len(before_p)
    assert seg.indexes["dense"].inner.index.ntotal == N - len(before_p)  # merged compact
    # and the rerank feature reads the column
    from polyindex.query.candidates import collect
    from polyindex.rerank import schema
    cand = collect(c, [("q", "wing flutter")], None, profile="hybrid", window=10)
    col = schema.NAMES.index("doc_quality")
    for i, d in enumerate(cand.doc_ids):
        assert cand.X[i, col] == pytest.approx(before_q[d])


def test_prune_keeps_the_lowest_fraction_out_of_every_costly_index(several):
    quality, pruned = by_id(several, "quality"), pruned_ids(several)
    thr = several.table.sealed_snapshot().manifest.config.prune_threshold
    assert several.table.sealed_snapshot().manifest.config.prune_quality == P
    assert pruned == {i for i, q in quality.items() if q < np.float32(thr)}
    assert len(pruned) == math.floor(P * N)  # no ties at the threshold in this input
    assert max(quality[i] for i in pruned) < min(q for i, q in quality.items() if i not in pruned)
    missing = sum(e.indexes["dense"].get("missing", 0)
                  for e in several.table.sealed_snapshot().manifest.segments)
    assert missing == len(pruned)
    # the faiss index holds the kept rows only: pruning saves the dense index's bytes
    held = sum(seg.indexes["dense"].inner.index.ntotal
               for seg in several.table.sealed_snapshot().segments)
    assert held == N - len(pruned)
    for profile in ("dense", "sparse", "tree"):
        found = {h.id for h in several.query("wing flutter heat shock", k=N, profile=profile)}
        assert found and not found & pruned, profile
        assert len(found) <= N - len(pruned)
    assert len({h.id for h in several.query("wing flutter heat shock", k=N,
                                            profile="dense")}) == N - len(pruned)


def test_a_pruned_document_is_stored_got_and_found_by_lexical_only(several):
    pruned = sorted(pruned_ids(several))
    assert pruned
    docs = several.get(pruned)
    assert [d.id for d in docs] == pruned and all(d.text for d in docs)
    for pid, doc in zip(pruned, docs):
        assert [h.id for h in several.query(f"tag{pid[1:]}", k=1, profile="lexical")] == [pid]
        assert pid not in {h.id for h in several.query(doc.text, k=N, profile="dense")}
        assert pid in {h.id for h in several.query(f"tag{pid[1:]}", k=N, profile="hybrid")}
    assert several.count() == N


def test_results_do_not_depend_on_segmentation(one, several):
    assert len(one.table.sealed_snapshot().segments) == 1
    assert len(several.table.sealed_snapshot().segments) == 3
    assert pruned_ids(one) == pruned_ids(several)
    assert by_id(one, "quality") == by_id(several, "quality")
    for text in ("wing flutter", "shock wave pressure", "turbulent laminar nozzle"):
        for profile in ("lexical", "dense", "hybrid"):
            a = [(h.id, round(h.score, 4)) for h in one.query(text, k=10, profile=profile)]
            b = [(h.id, round(h.score, 4)) for h in several.query(text, k=10, profile=profile)]
            assert a == b, (text, profile)


def test_later_writes_use_the_stored_threshold(tmp_path):
    c = build(tmp_path, "later", 1000, kinds=["lexical", "dense"])
    thr = c.table.sealed_snapshot().manifest.config.prune_threshold
    c.add([{"_id": "rep", "text": "flow flow flow flow flow flow flow flow flow flow"},
           {"_id": "rich", "text": "supersonic nozzle turbulent laminar boundary layer heat"}])
    q = by_id(c, "quality")
    assert pruned_ids(c) == {i for i, v in q.items() if v < np.float32(thr)}
    assert c.table.sealed_snapshot().manifest.config.prune_threshold == thr
    with pytest.raises(InvalidArgument, match="already prunes"):
        c.index(write_source(tmp_path / "more.jsonl", 5, seed=3), prune_quality=0.5)


@pytest.mark.parametrize("bad", [-0.1, 1, 1.5, "abc", float("nan"), True])
def test_a_bad_fraction_is_refused_and_commits_nothing(tmp_path, bad):
    src = write_source(tmp_path / "src.jsonl", 5)
    c = polyindex.open(tmp_path / "data").create_collection("c", ["lexical"])
    with pytest.raises(InvalidArgument, match="prune_quality"):
        c.index(src, prune_quality=bad)
    assert c.count() == 0 and not c.table.sealed_snapshot().manifest.segments
    res = CliRunner().invoke(app, ["index", str(src), "--data", str(tmp_path / "cli"),
                                   "--collection", "x", "--prune-quality", str(bad),
                                   "--no-progress"])
    assert res.exit_code != 0 and "prune_quality" in (res.output + str(res.exception))
    assert not (tmp_path / "cli" / "x").exists()


def test_a_damaged_quality_artifact_is_corrupt_not_a_crash(tmp_path):
    eng = polyindex.open(tmp_path / "data")
    c = eng.create_collection("dmg", ["lexical"])
    c.index(write_source(tmp_path / "src.jsonl", 8), prune_quality=0.25)
    eng.close()
    lm = tmp_path / "data" / "dmg" / "artifacts" / "quality" / "lm.npz"
    lm.write_bytes(lm.read_bytes()[:50])
    with pytest.raises(Corrupt):
        polyindex.open(tmp_path / "data").collection("dmg").add([{"_id": "z", "text": "wing"}])


def test_multivector_pruned_rows_are_not_encoded_nor_found(tmp_path):
    c = build(tmp_path, "mv", 15, kinds=["lexical", "multivector:KMeans64,residual=none"])
    pruned = pruned_ids(c)
    assert len(pruned) == math.floor(P * N)
    found = {h.id for h in c.query("wing flutter heat shock", k=N, profile="multivector")}
    assert found and not found & pruned and len(found) == N - len(pruned)
    c.compact(max_segments=1)
    assert pruned_ids(c) == pruned
    found = {h.id for h in c.query("wing flutter heat shock", k=N, profile="multivector")}
    assert not found & pruned and len(found) == N - len(pruned)


def test_hybrid_fuses_a_pruned_document_as_if_every_leg_saw_it(several):
    """The dense leg cannot see a pruned document: it abstains (the fused score is scaled by
    all legs' weight over lexical's) instead of ranking it below every document both found."""
    from polyindex.query.profiles import NEURAL_WEIGHT
    pruned = pruned_ids(several)
    pid = sorted(pruned)[0]
    hits = several.query(f"tag{pid[1:]} wing flutter", k=N, profile="hybrid", explain=True)
    assert hits[0].id == pid  # its own tag makes it lexical's first
    checked = {"pruned": 0, "lexical only": 0}
    for h in hits:
        lex, den = h.explain["stages"]["lexical"], h.explain["stages"]["dense"]
        if lex is None or den is not None:
            continue
        scale = (1 + NEURAL_WEIGHT) if h.id in pruned else 1.0
        assert h.score == pytest.approx(scale / (60 + lex["rank"])), h.id
        checked["pruned" if h.id in pruned else "lexical only"] += 1
    assert checked["pruned"] >= 2, checked


def test_a_pruned_candidate_takes_its_windows_median_cosines(several):
    """Its vector is absent (NaN): it must neither poison the window's pseudo-relevant
    centroid (every candidate's dense_prf_cos NaN) nor read as a cosine of 0 to the ranker."""
    from polyindex.query.candidates import collect
    from polyindex.rerank import schema
    pruned = pruned_ids(several)
    pid = sorted(pruned)[0]
    cand = collect(several, [("q", f"tag{pid[1:]} wing flutter")], None, profile="hybrid",
                   window=N)
    assert cand.doc_ids[0] == pid  # first in the window: first in the centroid's documents
    gone = np.array([d in pruned for d in cand.doc_ids])
    assert gone.sum() >= 2 and (~gone).sum() >= 2
    for name in ("dense_cos", "dense_prf_cos"):
        col = cand.X[:, schema.NAMES.index(name)]
        assert np.isfinite(col).all(), name
        assert np.allclose(col[gone], np.median(col[~gone])), name
        assert len(np.unique(col[~gone])) > 1, name  # real cosines for the others


def test_a_pruned_candidate_is_ranked_by_dense_where_lexical_ranks_it(several):
    """The ranker's fusion features abstain as fusion does: the dense stage puts a pruned
    candidate at its lexical rank (with the dense score of that rank), so agreement and RRF
    read as for a document both stages found."""
    from polyindex.query.candidates import collect
    from polyindex.rerank import schema
    pruned = pruned_ids(several)
    pid = sorted(pruned)[0]
    cand = collect(several, [("q", f"tag{pid[1:]} wing flutter")], None, profile="hybrid",
                   window=N)
    col = {n: cand.X[:, schema.NAMES.index(n)] for n in
           ("lexical_rank", "dense_rank", "dense_score", "n_found", "rrf")}
    dense_scores = sorted((h.score for h in several.query(f"tag{pid[1:]} wing flutter", k=N,
                                                          profile="dense")), reverse=True)
    seen = 0
    for i, d in enumerate(cand.doc_ids):
        if d not in pruned or np.isnan(col["lexical_rank"][i]):
            continue
        r = int(col["lexical_rank"][i])
        assert col["dense_rank"][i] == r and col["n_found"][i] == 2, d
        assert col["rrf"][i] == pytest.approx(2 / (schema.RRF_K + r)), d
        if r <= len(dense_scores):
            assert col["dense_score"][i] == pytest.approx(dense_scores[r - 1], abs=1e-5), d
        seen += 1
    assert seen >= 2
