"""BM25 variants of the lexical index: scores equal bm25s's (the reference) for every variant,
factory strings and params, and collection-wide statistics across segments."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.index.lexical.analyzer import Analyzer
from polyindex.index.lexical.bm25 import VARIANTS
from polyindex.index.lexical.kind import LexicalKind
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


# --------------------------------------------------------------------------- tune-bm25

TOPICS = ("river", "ocean", "forest", "glacier", "desert", "canyon")


def tuning_data(folder: Path):
    """Per topic, 3 short documents (judged relevant) and 3 long ones repeating the topic
    word (not relevant): the default b=0.75 ranks the long ones first, b=1 the short ones."""
    docs, qrels = [], {}
    for t in TOPICS:
        for i in range(3):
            docs.append({"_id": f"{t}-s{i}", "title": "", "text": f"{t} short{t}{i}"})
            filler = " ".join(f"f{t}{i}x{j}" for j in range(90))
            docs.append({"_id": f"{t}-l{i}", "title": "", "text": f"{(t + ' ') * 10}{filler}"})
        qrels[f"q-{t}"] = {f"{t}-s{i}": 1 for i in range(3)}
    queries = [(f"q-{t}", t) for t in TOPICS]
    path = folder / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path, queries, qrels


def test_tuned_scorer_is_stored_survives_reopening_and_is_used(tmp_path):
    import polyindex
    from polyindex.cli.tune import Grid, tune
    src, queries, qrels = tuning_data(tmp_path)
    coll = polyindex.open(tmp_path / "data").create_collection("c", ["lexical"])
    coll.index(src)
    before = [h.id for h in coll.query("river", k=3, profile="lexical")]
    assert all("-l" in i for i in before)  # default b = 0.75: the long documents
    grid = Grid(variants=("bm25", "bm25l"), k1=(1.5,), b=(0.2, 0.75, 1.0), delta=(0.5,))
    report = tune(coll, queries, qrels, n_folds=3, grid=grid)
    assert report["default"]["params"] == "bm25,k1=1.5,b=0.75" and report["stored"]
    assert report["settings"] == 6
    cv = report["cross_validation"]
    assert cv["tuned"] == 1.0 > cv["default"]  # every held-out fold picks a b = 1 setting
    assert all(f["params"].endswith("b=1") or ",b=1," in f["params"] for f in cv["per_fold"])
    tuned = report["tuned"]["params"]
    assert tuned == "bm25,k1=1.5,b=1"  # tie with bm25l: the earlier setting of the grid
    assert coll.config.lexical_params == tuned
    assert [h.id for h in coll.query("river", k=3, profile="lexical")] == \
        ["river-s0", "river-s1", "river-s2"]
    coll.close()
    # stored in the manifest, applied when the collection is opened again
    again = polyindex.open(tmp_path / "data").collection("c")
    manifest = json.loads((tmp_path / "data" / "c" / "manifest.json").read_text())
    assert manifest["collection"]["lexical_params"] == tuned
    assert again.kinds["lexical"].describe() == f"lexical:{tuned}"
    assert again.config.indexes == ["lexical:bm25,k1=1.5,b=0.75"]  # the factory is unchanged
    hits = again.query("river", k=3, profile="lexical")
    explicit = again.query("river", k=3, profile={"retrieve": [
        {"index": "lexical", "k": 3, "params": "variant=bm25,k1=1.5,b=1"}]})
    assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in explicit]
    assert [h.id for h in again.query("river", k=3, profile="lexical-prf")][0].startswith("river-s")
    # an invalid scorer is refused before anything is stored
    with pytest.raises(InvalidArgument, match="unknown BM25 variant"):
        again.table.commit_metadata(lexical_params="bm99")
    reader = polyindex.open(tmp_path / "data", readonly=True)
    assert reader.collection("c").config.lexical_params == tuned
    # clearing it restores the factory's scorer
    again.table.commit_metadata(lexical_params="")
    assert [h.id for h in again.query("river", k=3, profile="lexical")] == before


def test_tune_with_a_test_split_and_errors(tmp_path):
    import polyindex
    from polyindex.cli.tune import Grid, parse_grid, tune
    src, queries, qrels = tuning_data(tmp_path)
    coll = polyindex.open(tmp_path / "data").create_collection("c", ["lexical"])
    coll.index(src)
    train = {q: v for q, v in qrels.items() if q in ("q-river", "q-ocean", "q-forest")}
    test = {q: v for q, v in qrels.items() if q not in train}
    grid = Grid(variants=("bm25",), k1=(1.5,), b=(0.75, 1.0))
    report = tune(coll, queries, train, test_qrels=test, grid=grid, store=False)
    assert report["test"] == {"queries": 3, "default": pytest.approx(report["test"]["default"]),
                              "tuned": 1.0} and report["test"]["default"] < 1.0
    assert "cross_validation" not in report and not report["stored"]
    assert coll.config.lexical_params == ""
    with pytest.raises(InvalidArgument, match="--folds must be in 2..6"):
        tune(coll, queries, qrels, n_folds=7, grid=grid)
    with pytest.raises(InvalidArgument, match="not an ir-measures measure"):
        tune(coll, queries, qrels, measure="nDCG@@", grid=grid)
    with pytest.raises(InvalidArgument, match="no query has training judgements"):
        tune(coll, queries, {"nope": {"x": 1}}, grid=grid)
    with pytest.raises(InvalidArgument, match="unknown BM25 variant"):
        parse_grid("bm25,okapi", None, None, None)
    assert parse_grid("BM25plus", "1,2", None, None).variants == ("bm25+",)


def test_tune_and_eval_all_commands(tmp_path, cli):
    src, queries, qrels = tuning_data(tmp_path)
    qfile, qrels_file = tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
    qfile.write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries))
    qrels_file.write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{r}\n" for q, docs in qrels.items() for d, r in docs.items()))
    data = tmp_path / "data"
    assert cli("index", src, "--data", data, "-c", "c", "--index", "lexical",
               "--no-progress").returncode == 0
    p = cli("tune-bm25", "--data", data, "-c", "c", "--queries", qfile, "--qrels", qrels_file,
            "--folds", "3", "--variants", "bm25", "--k1", "1.5", "--b", "0.75,1", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["tuned"]["params"] == "bm25,k1=1.5,b=1" and report["stored"]
    p = cli("eval", "--data", data, "-c", "c", "--queries", qfile, "--qrels", qrels_file,
            "--profile", "all", "--json")
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout)["results"]
    assert list(results) == ["lexical", "lexical-prf"]  # every built-in of a lexical collection
    assert results["lexical"]["nDCG@10"] == pytest.approx(1.0)  # the stored scorer is used
    p = cli("eval", "--data", data, "-c", "c", "--queries", qfile, "--qrels", qrels_file,
            "--profile", "all")
    assert p.returncode == 0 and "lexical-prf" in p.stdout and "nDCG@10" in p.stdout
    bad = cli("tune-bm25", "--data", data, "-c", "c", "--queries", qfile, "--qrels", qrels_file,
              "--b", "0.5,x")
    assert bad.returncode == 2 and "--b: expected comma-separated numbers" in bad.stderr
