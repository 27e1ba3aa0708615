"""Learning an adapted encoder: synthetic queries, the teacher's pairs, the refusal of a corpus
too small to learn from, and (slow) a real fine-tune that writes a loadable, different model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polyindex.adapt.learn import learn
from polyindex.adapt.recipe import DEFAULT, Recipe
from polyindex.adapt.synth import SynthQuery, distinctive_terms, make_queries
from polyindex.adapt.teacher import fused_teacher, label
from polyindex.errors import InvalidArgument

DOC = ("Photosynthesis converts light energy into chemical energy in chloroplasts. "
       "The chlorophyll pigment absorbs red and blue light strongly. "
       "Plants release oxygen as a byproduct of splitting water molecules.")
OTHERS = ["Chloroplasts hold chlorophyll and the thylakoid membranes of plant cells.",
          "Light energy from the sun warms the oceans and drives the weather.",
          "Water molecules split when enough energy is absorbed by the pigment.",
          "The stock market fell sharply as investors sold technology shares."]
CORPUS = [DOC, *OTHERS]


def test_synthetic_queries_are_deterministic_and_come_from_their_document():
    recipe = Recipe(queries_per_doc=3, ict_remove=1.0)
    titles = ["Photosynthesis in plants", None, None, None, None]
    a = make_queries(CORPUS, recipe, seed=7, titles=titles)
    assert a == make_queries(CORPUS, recipe, seed=7, titles=titles)
    assert a != make_queries(CORPUS, recipe, seed=8, titles=titles)
    mine = [q for q in a if q.doc == 0]
    assert sorted(q.kind for q in mine) == ["span", "terms", "title"]
    by_kind = {q.kind: q for q in mine}
    span = by_kind["span"]
    # a span is a run of words of one sentence, cut out of its positive (inverse cloze)
    assert span.text in DOC and span.text not in span.positive
    assert 4 <= len(span.text.split()) <= 16
    assert by_kind["title"].text == "Photosynthesis in plants"
    assert by_kind["title"].positive == DOC
    # terms: words of the document, no stopwords, drawn from its distinctive ones
    terms = by_kind["terms"].text.split()
    assert set(terms) <= set(distinctive_terms(CORPUS)[0])
    assert 3 <= len(terms) <= 6 and not {"the", "and", "into", "of"} & set(terms)
    # documents without a title make span and terms queries only
    assert {q.kind for q in a if q.doc == 4} == {"span", "terms"}


def test_distinctive_terms_prefer_terms_shared_with_the_corpus_and_frequent_in_the_document():
    top = distinctive_terms(CORPUS, k=4)[0]
    # "light" and "energy" (twice here, in other documents too) lead, "light" rarer in the
    # corpus; a word of this document alone ("byproduct": as likely a typo as a topic) trails
    assert top[:2] == ["light", "energy"]
    assert "byproduct" not in top and "chlorophyll" in top


def test_a_corpus_too_small_is_refused_before_the_teacher_is_asked(tmp_path):
    asked = []

    def teacher(queries, depth):
        asked.append(len(queries))
        return [[0] for _ in queries]
    with pytest.raises(InvalidArgument, match=rf"at least {DEFAULT.min_docs} documents.*has 5"):
        learn(CORPUS, teacher, "all-MiniLM-L6-v2", tmp_path / "out")
    # short texts do not count as documents to learn from
    texts = ["too short"] * 1000 + CORPUS
    with pytest.raises(InvalidArgument, match=r"has 5 \(of 1005\)"):
        learn(texts, teacher, "all-MiniLM-L6-v2", tmp_path / "out")
    assert asked == [] and not (tmp_path / "out").exists()


def test_the_teacher_keeps_the_pairs_it_is_sure_of_with_a_lower_ranked_negative():
    recipe = Recipe(keep_rank=2, neg_ranks=(3, 6))
    qs = [SynthQuery("q0", 0, "span", "d0"), SynthQuery("q1", 1, "terms", "d1"),
          SynthQuery("q2", 2, "span", "d2")]
    ranked = [[5, 0, 1, 2, 3, 4, 6], [9, 8, 1, 2, 3, 4], [2, 7, 8]]
    pairs, counts = label(qs, ranked, recipe, seed=0)
    assert [p.doc for p in pairs] == [0, 2]  # q1's source is only third: unsure, dropped
    assert pairs[0].negative in (2, 3, 4) and pairs[0].positive == "d0"
    assert pairs[1].negative is None  # the teacher ranked nothing that low
    assert counts == {"queries": 3, "kept": 2, "unsure": 1, "kept_by_kind": {"span": 2},
                      "with_negative": 1}


def test_the_next_rounds_teacher_fuses_teacher_and_student():
    assert fused_teacher([[1, 2, 3]], [[3, 1, 4]]) == [[1, 3, 2, 4]]


DEMO = Path(__file__).resolve().parents[1] / "engine" / "cli" / "demo_data" / "cranfield"


@pytest.mark.slow
def test_learn_writes_a_loadable_student_whose_embeddings_differ_from_the_base(tmp_path):
    import polyindex
    from polyindex.adapt.teacher import collection_teacher
    from polyindex.encode.text import resolve_model
    from sentence_transformers import SentenceTransformer
    docs = [json.loads(line) for line in (DEMO / "corpus.jsonl").open()][:240]
    texts = [f"{d['title']} {d['text']}" for d in docs]
    with polyindex.open(tmp_path / "data") as eng:  # a lexical teacher: no encoding needed
        coll = eng.create_collection("c", indexes=["lexical"])
        coll.add([{"id": d["_id"], "title": d["title"], "text": d["text"]} for d in docs])
        teacher = collection_teacher(coll, [d["_id"] for d in docs])
        seen = []
        recipe = Recipe(min_docs=200, max_queries=160, max_steps=3, batch_size=8,
                        max_seq_length=64, min_pairs=16)
        report = learn(texts, teacher, "all-MiniLM-L6-v2", tmp_path / "student", recipe,
                       progress=lambda *a: seen.append(a), titles=[d["title"] for d in docs])
    assert report["steps"] == 3 and report["queries"] == 160
    # the guard's share: every query of 40 documents held back, judged after training
    assert report["held_back"] == 80 and report["guard"]["queries"] == 80
    assert report["guard"]["served"] == "dense" and isinstance(report["guard"]["passed"], bool)
    assert ("guard", 1, 1) in seen
    assert 16 <= report["pairs"] <= 160 and json.dumps(report)
    assert ("train", 3, 3) in seen and any(p[0] == "teacher" for p in seen)
    student = SentenceTransformer(str(tmp_path / "student"), device="cpu")
    base = SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu")
    assert student.max_seq_length == base.max_seq_length  # served as the base was
    a, b = (m.encode(texts[:8], normalize_embeddings=True) for m in (student, base))
    assert a.shape == b.shape
    cos = (a * b).sum(1)
    assert np.all(cos < 0.99999) and np.all(cos > 0.8)  # moved, not destroyed
