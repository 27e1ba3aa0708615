"""The adapt guard (issue 40): a learned encoder is committed only when it beats the current
one on held-back synthetic queries; otherwise the collection is left exactly as it was and the
report says why.

The encoders compared are real sentence-transformers folders: the shipped model and a copy of
it with seeded noise in its upper layers (``damaged``: a real encoder that retrieves worse).
The stand-in learners write one of them and then judge it with the real guard
(``guard.hold_back`` + ``guard.evaluate``), as ``adapt.learn`` does after training."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

import polyindex
from polyindex.adapt import guard
from polyindex.adapt.recipe import Recipe
from polyindex.adapt.synth import SynthQuery, make_queries
from polyindex.adapt.teacher import label

DEMO = Path(__file__).resolve().parents[1] / "engine" / "cli" / "demo_data" / "cranfield"
QUERIES = ["boundary layer on a flat plate", "heat transfer at hypersonic speed",
           "wing in a propeller slipstream", "buckling of thin cylindrical shells"]


def demo_docs(n: int) -> list[dict]:
    out = []
    for line in (DEMO / "corpus.jsonl").open():
        d = json.loads(line)
        if len(d["text"].split()) >= 30:  # enough text for span and terms queries
            out.append({"id": d["_id"], "title": d["title"], "text": d["text"]})
        if len(out) == n:
            return out
    return out


# -- without a model ------------------------------------------------------------------------
def test_every_query_of_a_held_back_document_is_kept_out_of_training():
    qs = [SynthQuery(f"q{d}-{k}", d, "span", "p") for d in range(300) for k in range(2)]
    train, held, docs = guard.hold_back(qs, Recipe(guard_share=0.1, guard_min_queries=100))
    assert len(docs) == 50  # 10% of 300 is 30 documents, but 100 queries need 50
    assert {q.doc for q in held} == docs and not docs & {q.doc for q in train}
    assert len(train) + len(held) == len(qs) and len(held) == 100
    assert guard.hold_back(qs, Recipe(), seed=0)[2] == docs  # seeded
    assert guard.hold_back(qs, Recipe(), seed=1)[2] != docs
    # a small corpus keeps at least half its documents to teach with
    small = qs[:40]
    assert len(guard.hold_back(small, Recipe())[2]) == 10


def test_held_back_documents_are_never_drawn_as_hard_negatives():
    recipe = Recipe(keep_rank=1, neg_ranks=(1, 4))
    qs = [SynthQuery("q0", 0, "span", "d0"), SynthQuery("q1", 1, "span", "d1")]
    ranked = [[0, 7, 8, 9], [1, 7, 8, 6]]
    for seed in range(20):
        pairs, _ = label(qs, ranked, recipe, seed=seed, unseen={7, 8})
        assert [p.negative for p in pairs] == [9, 6]


def test_negatives_come_from_the_lexical_ranking_when_the_recipe_says_so():
    recipe = Recipe(keep_rank=1, neg_ranks=(0, 3), neg_source="lexical")
    qs = [SynthQuery("q0", 0, "span", "d0"), SynthQuery("q1", 1, "span", "d1")]
    ranked = [[0, 7, 8, 9], [1, 7, 8, 6]]   # the teacher: sure of both sources
    lexical = [[5, 0, 4], [1, 3, 2]]        # BM25's top 3: the source and held-back excluded
    for seed in range(20):
        pairs, _ = label(qs, ranked, recipe, seed=seed, unseen={4}, negatives=lexical)
        assert pairs[0].negative == 5 and pairs[1].negative in {3, 2}
    assert {label(qs, ranked, recipe, seed=s, negatives=lexical)[0][1].negative
            for s in range(20)} == {3, 2}


def test_the_cli_line_says_why_nothing_was_committed():
    from polyindex.cli.adapt_cmd import describe
    report = {"committed": False, "encoder": "base", "previous": "base", "documents": 5,
              "reencoded_rows": 0, "delta_rows": 0,
              "seconds": {"learn": 12.0, "reencode_and_commit": 0.0},
              "refused": "on 100 held-back synthetic queries ... at least x1.020"}
    line = describe("c", report)
    assert line.startswith("not adapted 'c'") and "keeps encoder base" in line
    assert line.endswith("at least x1.020")


# -- real encoders -------------------------------------------------------------------------
def damaged(base_model: str, out_dir: Path, seed: int = 1) -> None:
    """The base model with seeded noise (the size of each weight matrix's own spread) in
    its upper layers: a real encoder that retrieves worse."""
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(base_model, device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(f"encoder.layer.{i}." in name for i in (3, 4, 5)) and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * float(p.std()) * 0.8)
    model.save(str(out_dir))


def pristine(base_model: str, out_dir: Path) -> None:
    """The shipped model itself, whatever the collection's current encoder is."""
    from sentence_transformers import SentenceTransformer

    from polyindex.encode.text import resolve_model
    SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu").save(str(out_dir))


@functools.lru_cache(maxsize=None)  # a model's load once per path (a model dir is written once)
def encoder(path: str):
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(path, device="cpu")
    # the guard's verdicts here only need a damaged encoder to rank worse than the shipped
    # one: the first 128 tokens of a document show it at half the cost of 256
    model.max_seq_length = 128
    return lambda xs: model.encode(list(xs), normalize_embeddings=True, batch_size=64)


def guarded(write):
    """A learner (``adapt.learn.learn``'s signature) that writes its model with ``write``
    and judges it as learn does: held-back synthetic queries, the real guard."""
    def learner(texts, teacher, base_model, out_dir, recipe=None, progress=None,
                device="cpu", seed=0, titles=None, lexical=None):
        recipe = recipe or Recipe()
        write(base_model, out_dir)
        _, held, _ = guard.hold_back(make_queries(texts, recipe, seed, titles), recipe, seed)
        verdict = guard.evaluate(encoder(base_model), encoder(str(out_dir)), texts, held,
                                 recipe, seed, lexical)
        return {"learner": write.__name__, "guard": verdict}
    return learner


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from polyindex.encode.text import resolve_model
    base = resolve_model("all-MiniLM-L6-v2")
    bad = tmp_path_factory.mktemp("models") / "damaged"
    damaged(base, bad)
    return base, str(bad)


@pytest.mark.slow
def test_the_guard_passes_only_a_student_better_than_the_current_encoder(models):
    base, bad = models
    docs = demo_docs(150)
    texts = [f"{d['title']} {d['text']}" for d in docs]
    recipe = Recipe()
    _, held, _ = guard.hold_back(make_queries(texts, recipe, 0), recipe, 0)
    good_enc, bad_enc = encoder(base), encoder(bad)
    worse = guard.evaluate(good_enc, bad_enc, texts, held, recipe)
    assert not worse["passed"] and worse["served"] == "dense"
    assert worse["dense"]["mrr_student"] < worse["dense"]["mrr_old"]
    assert "must be at least x1.020" in worse["reason"]
    better = guard.evaluate(bad_enc, good_enc, texts, held, recipe)
    assert better["passed"] and better["dense"]["ratio"] >= 1.02
    assert better["dense"]["wins"] > better["dense"]["losses"]
    same = guard.evaluate(good_enc, good_enc, texts, held, recipe)  # not better: refused
    assert not same["passed"] and same["dense"]["ratio"] == 1.0
    assert same["queries"] == len(held) >= 100 and same["pool"] == 150


def answers(coll, profile="dense"):
    return [[(h.id, round(h.score, 5)) for h in hits]
            for hits in coll.query_batch(QUERIES, k=5, profile=profile)]


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.slow
def test_a_student_not_better_is_not_committed_and_a_better_one_is(tmp_path, models):
    from polyindex.adapt.run import adapt
    eng = polyindex.open(tmp_path / "d")
    c = eng.create_collection("c", ["lexical", "dense"], dtype="float32")
    c.add(demo_docs(120))
    folder = tmp_path / "d" / "c"
    before, before_h = answers(c), answers(c, "hybrid")
    files = listing(folder)

    report = adapt(c, learner=guarded(damaged))
    assert report["committed"] is False and report["encoder"] == "base"
    verdict = report["learn"]["guard"]
    assert not verdict["passed"] and verdict["served"] == "fused"  # hybrid, as served
    assert verdict["fused"]["mrr_student"] < verdict["fused"]["mrr_old"]
    assert report["refused"] == verdict["reason"] and "held-back" in report["refused"]
    assert report["reencoded_rows"] == 0
    # exactly as it was: every file, byte for byte, and the same answers
    assert listing(folder) == files and not (folder / "encoders").exists()
    assert answers(c) == before and answers(c, "hybrid") == before_h
    assert c.info()["encoder"] == "base"

    # a margin below zero lets the damaged one through: now the current encoder is bad
    forced = adapt(c, learner=guarded(damaged), recipe={"guard_margin": -1.0})
    assert forced["committed"] is True and forced["encoder"] == "v2"
    assert answers(c) != before
    # the shipped model beats it on held-back queries: committed, and its answers are back
    better = adapt(c, learner=guarded(pristine))
    assert better["committed"] is True and better["refused"] is None
    assert better["learn"]["guard"]["passed"] and better["encoder"] == "v3"
    assert better["learn"]["guard"]["fused"]["ratio"] >= 1.02
    assert answers(c) == before and answers(c, "hybrid") == before_h
    eng.close()
