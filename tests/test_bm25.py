"""BM25 variants of the lexical index: scores equal bm25s's (the reference) for every variant,
factory strings and params, and collection-wide statistics across segments."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.index.analyzer import Analyzer
from polyindex.index.bm25 import VARIANTS
from polyindex.index.lexical import LexicalKind
from polyindex.index.protocol import BuildBatch, Query

bm25s = pytest.importorskip("bm25s")

WORDS = ("river mountain ocean forest desert city harbor valley glacier canyon meadow island "
         "prairie volcano tundra lagoon marsh plateau delta reef").split()
# bm25s's (method, idf_method) for each of our variants; ``bm25`` is Lucene's idf with the
# (k1 + 1) numerator, which bm25s calls the ATIRE term-frequency part.
REFERENCE = {"bm25": ("atire", "lucene"), "lucene": ("lucene", "lucene"),
             "robertson": ("robertson", "robertson"), "atire": ("atire", "atire"),
             "bm25l": ("bm25l", "bm25l"), "bm25+": ("bm25+", "bm25+")}


def corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    p /= p.sum()
    # lengths 1..40 so length normalization matters; Zipf-like so some terms are in over half
    # the documents (robertson's clamped idf) and some in one
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 40), p=p)) for _ in range(n)]


def build(k: LexicalKind, texts, folder: Path):
    info = k.build(BuildBatch([f"d{i}" for i in range(len(texts))], [""] * len(texts),
                              list(texts)), folder)
    return k.open(folder, json.loads(json.dumps(info)))


def prepare(k, segs, texts, params=None):
    return k.prepare([Query(text=t) for t in texts], segs, [None] * len(segs), params or {}, {})


QUERIES = ["river ocean", "glacier glacier reef", "marsh prairie volcano city", "delta",
           "harbor unknownword"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("k1,b,delta", [(1.5, 0.75, 0.5), (0.9, 0.4, 1.0), (2.0, 1.0, 0.25)])
def test_scores_equal_bm25s(tmp_path, variant, k1, b, delta):
    texts = corpus(120, seed=7)
    body = f"{variant},k1={k1},b={b}" + (f",delta={delta}" if variant in ("bm25l", "bm25+") else "")
    k = LexicalKind(body)
    seg = build(k, texts, tmp_path)
    analyzer = Analyzer()
    method, idf_method = REFERENCE[variant]
    ref = bm25s.BM25(k1=k1, b=b, delta=delta, method=method, idf_method=idf_method)
    ref.index(analyzer.analyze_many(texts), show_progress=False)  # the same analyzed terms
    prepared = prepare(k, [seg], QUERIES)
    ours = seg.score(prepared, np.arange(len(texts)))
    for qi, q in enumerate(QUERIES):
        theirs = ref.get_scores(analyzer.analyze(q))
        np.testing.assert_allclose(ours[qi], theirs, rtol=2e-5, atol=1e-5,
                                   err_msg=f"{variant} query {q!r}")
    # search returns the same numbers as score, best first, over the rows matching a term
    scores, rows = seg.search(prepared, 20, {}, None)
    for qi in range(len(QUERIES)):
        valid = rows[qi] >= 0
        np.testing.assert_array_equal(scores[qi][valid], ours[qi][rows[qi][valid]])
        assert (np.diff(scores[qi][valid]) <= 0).all()
        # no row left out scores above the last one returned
        if valid.all():
            assert ours[qi].max() <= scores[qi][0] and \
                np.sort(ours[qi])[::-1][19] == pytest.approx(scores[qi][-1], rel=1e-6)


def test_variants_rank_differently():
    """The variants are not one formula under several names (else the test above is weak)."""
    texts = corpus(120, seed=7)
    analyzer = Analyzer()
    tops = set()
    for variant in VARIANTS:
        method, idf_method = REFERENCE[variant]
        ref = bm25s.BM25(k1=1.2, b=0.75, method=method, idf_method=idf_method)
        ref.index(analyzer.analyze_many(texts), show_progress=False)
        tops.add(tuple(tuple(np.argsort(-ref.get_scores(analyzer.analyze(q)), kind="stable")[:10])
                       for q in QUERIES))
    assert len(tops) >= 4


@pytest.mark.parametrize("variant", ["bm25l", "bm25+", "robertson"])
def test_segments_do_not_change_scores(tmp_path, variant):
    texts = corpus(90, seed=3)
    k = LexicalKind(variant)
    one = build(k, texts, tmp_path / "one")
    parts = [build(k, texts[i:i + 30], tmp_path / f"p{i}") for i in range(0, 90, 30)]
    whole = one.score(prepare(k, [one], QUERIES), np.arange(90))
    p = prepare(k, parts, QUERIES)
    split = np.concatenate([s.score(p, np.arange(30)) for s in parts], axis=1)
    np.testing.assert_allclose(split, whole, rtol=1e-6)


def test_factory_strings_and_params(tmp_path):
    assert LexicalKind("").describe() == "lexical:bm25,k1=1.5,b=0.75"
    assert LexicalKind("bm25l").describe() == "lexical:bm25l,k1=1.5,b=0.75,delta=0.5"
    assert LexicalKind("BM25plus,k1=1.2,b=0.3,delta=1").describe() == \
        "lexical:bm25+,k1=1.2,b=0.3,delta=1"
    assert LexicalKind("lucene,k1=0.9").describe() == "lexical:lucene,k1=0.9,b=0.75"
    with pytest.raises(InvalidArgument, match="unknown BM25 variant 'bm26'"):
        LexicalKind("bm26")
    with pytest.raises(InvalidArgument, match="delta applies to bm25l and bm25\\+ only"):
        LexicalKind("robertson,delta=0.5")
    with pytest.raises(InvalidArgument, match="delta must be"):
        LexicalKind("bm25l,delta=-1")
    k = LexicalKind("bm25")
    seg = build(k, corpus(20, seed=1), tmp_path)
    # params pick a variant per query; search must get the params prepare got
    p = prepare(k, [seg], ["river"], {"variant": "bm25l", "delta": "1.0"})
    assert p.scorer.describe() == "bm25l,k1=1.5,b=0.75,delta=1"
    with pytest.raises(InvalidArgument, match="differs from the one the query was prepared for"):
        seg.search(p, 3, {"variant": "lucene"}, None)
    with pytest.raises(InvalidArgument, match="unknown option\\(s\\) kappa"):
        prepare(k, [seg], ["river"], {"kappa": "1"})
    # set_scorer (a collection's tuned parameters) changes what later queries prepare with
    k.set_scorer("robertson,k1=0.7,b=0.2")
    assert k.describe() == "lexical:robertson,k1=0.7,b=0.2"
    assert prepare(k, [seg], ["river"]).scorer.variant == "robertson"
