"""``polyindex adapt`` as a durable, revertible operation of a collection (issue 40, the
engine's half): the encoder as a checksummed artifact, one commit for encoder and vectors,
revert, refusals, writes during an adapt, kill -9 at every phase, the ranker on an adapted
collection.

The "learned" encoder here is a real sentence-transformers folder: the shipped model with a
seeded perturbation of one layer (``perturbed``), written by a learner with ``learn``'s
signature, so these tests do not depend on how learning is tuned; tests/test_adapt_learn*
run the real learner."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import polyindex
from polyindex.errors import Corrupt, FailedPrecondition, InvalidArgument

QUERIES = ["topic 3 words", "document 12 about", "words about topic 5", "fresh water fish"]


def corpus(n=60):
    return [{"id": f"d{i}", "title": f"title {i}",
             "text": f"document {i} about topic {i % 7} with words {i * 13 % 29} and "
                     f"{['fish', 'water', 'stone', 'glass', 'metal'][i % 5]}"} for i in range(n)]


def perturb_learner(texts, teacher, base_model, out_dir, recipe=None, progress=None,
                    device="cpu", seed=0, titles=None, lexical=None):
    """``adapt.learn.learn``'s signature: asks the teacher, then saves the base model with
    one layer moved by seeded noise (a different, deterministic, real encoder)."""
    import torch
    from sentence_transformers import SentenceTransformer
    ranked = teacher(texts[:4], 5)
    assert len(ranked) == 4 and all(isinstance(r, int) for r in ranked[0])
    model = SentenceTransformer(base_model, device="cpu")
    g = torch.Generator().manual_seed(1234 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "encoder.layer.5" in name and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    if progress is not None:
        progress("perturbed", 1, 1)
    model.save(str(out_dir))
    return {"learner": "perturbed", "texts": len(texts)}


def answers(coll, profile="dense"):
    return [[(h.id, round(h.score, 5)) for h in hits]
            for hits in coll.query_batch(QUERIES, k=5, profile=profile)]


def make(eng, name="c", indexes=("lexical", "dense")):
    c = eng.create_collection(name, list(indexes), dtype="float32")
    docs = corpus()
    c.add(docs[:30])
    c.add(docs[30:])
    c.delete(["d3"])
    return c


def adapt(coll, **kw):
    from polyindex.adapt.run import adapt as run
    return run(coll, learner=perturb_learner, **kw)


# -- refusals (no model loaded) ------------------------------------------------------------
def test_a_collection_without_text_model_is_refused(eng):
    c = eng.create_collection("v", ["dense:Flat"], model=None)
    c.add([{"id": "a", "vector": [1.0, 0.0, 0.0]}, {"id": "b", "vector": [0.0, 1.0, 0.0]}])
    with pytest.raises(FailedPrecondition, match="no text model"):
        c.adapt()


def test_a_collection_its_model_feeds_nothing_is_refused(eng):
    c = eng.create_collection("lex", ["lexical"])
    c.add([{"id": "a", "text": "some words"}])
    with pytest.raises(FailedPrecondition, match="no index its model feeds"):
        c.adapt()


def test_a_read_only_handle_and_a_sharded_collection_are_refused(tmp_path):
    from polyindex.distributed.serving import ShardedEngine
    eng = polyindex.open(tmp_path / "d")
    eng.create_collection("c", ["lexical"]).add([{"id": "a", "text": "x"}])
    eng.close()
    ro = polyindex.open(tmp_path / "d", readonly=True)
    with pytest.raises(FailedPrecondition, match="read-only"):
        ro.collection("c").adapt()
    ro.close()
    sh = ShardedEngine.in_process(tmp_path / "s", shards=2)
    try:
        sc = sh.create_collection("c", ["lexical"])
        with pytest.raises(FailedPrecondition, match="sharded.*one encoder must learn"):
            sc.adapt()
    finally:
        sh.close()


def test_a_bad_recipe_is_an_invalid_argument():
    pytest.importorskip("polyindex.adapt.recipe", reason="the learner's recipe (h-alearn)")
    from polyindex.adapt.run import recipe_of
    with pytest.raises(InvalidArgument, match="recipe"):
        recipe_of({"no_such_setting": "1"})


def test_the_cli_refuses_ray_options_without_ray(tmp_path, cli):
    r = cli("adapt", "--data", tmp_path, "--collection", "c", "--encoders", "2")
    assert r.returncode == 2 and "go with --ray" in r.stderr


# -- the artifact, revert, writes meanwhile ------------------------------------------------
@pytest.mark.slow
def test_adapt_commits_encoder_and_vectors_together_and_revert_restores(tmp_path):
    eng = polyindex.open(tmp_path / "d")
    c = make(eng)
    before, before_h = answers(c), answers(c, "hybrid")
    with pytest.raises(FailedPrecondition, match="never adapted"):
        c.adapt(revert=True)
    report = adapt(c)
    assert report["encoder"] == "v2" and report["previous"] == "base"
    assert report["documents"] == 59
    folder = tmp_path / "d" / "c"
    m = json.loads((folder / "manifest.json").read_text())
    rec = m["encoder"]["current"]
    assert rec["name"] == "v2" and m["encoder"]["previous"] is None
    assert "model.safetensors" in rec["files"] and (folder / "encoders" / "v2").is_dir()
    assert not (folder / "adapt").exists()  # the work folder goes with the commit
    adapted = answers(c)
    assert adapted != before
    # the stored vectors are the new encoder's: a document's vector is its text encoded
    from polyindex.encode.text import get_encoder
    from polyindex.storage.encoders import fingerprint
    enc = get_encoder(str(folder / "encoders" / "v2"), "float32", "cpu", fingerprint(rec))
    doc = c.get(["d7"], with_vectors=True)[0]
    from polyindex.types import document_text
    want = enc.encode([document_text(doc.title, doc.text)])[0]
    np.testing.assert_allclose(doc.vectors["dense"], want, atol=1e-5)
    assert c.info()["encoder"] == "v2"
    eng.close()
    eng = polyindex.open(tmp_path / "d")  # another process's view: the manifest's encoder
    c = eng.collection("c")
    assert answers(c) == adapted
    (folder / "adapt" / "v9-0123").mkdir(parents=True)  # an interrupted adapt's leftovers
    (folder / "encoders" / "v9").mkdir()
    r = c.adapt(revert=True)
    assert (r["encoder"], r["previous"]) == ("base", "v2")
    assert not (folder / "adapt").exists() and not (folder / "encoders" / "v9").exists()
    assert answers(c) == before and answers(c, "hybrid") == before_h
    r = c.adapt(revert=True)  # a revert of the revert: the adapted encoder again
    assert r["encoder"] == "v2" and answers(c) == adapted
    eng.close()


@pytest.mark.slow
def test_two_collections_with_different_encoders_never_share_a_model(tmp_path):
    eng = polyindex.open(tmp_path / "d")
    a, b = make(eng, "a"), make(eng, "b")
    adapt(a)
    from polyindex.adapt.run import adapt as run

    def other(*args, **kw):
        return perturb_learner(*args, **{**kw, "seed": 7})
    run(b, learner=other)
    assert a.encoding.encoder is not b.encoding.encoder
    assert answers(a) != answers(b)
    # the same folder name (v2) in both: the fingerprint keeps them apart
    assert a.table.encoder_now[0][1] != b.table.encoder_now[0][1]
    eng.close()


@pytest.mark.slow
def test_writes_while_re_encoding_are_re_encoded_at_the_commit(tmp_path):
    eng = polyindex.open(tmp_path / "d")
    c = make(eng)
    added = []

    def progress(phase, done=None, total=None, *rest):
        if phase == "re-encoding" and not added:  # mid-adapt: a write and a delete land
            added.append(c.add([{"id": "late", "text": "a late document about fish"}]))
            c.delete(["d10"])
    report = adapt(c, progress=progress)
    assert added and report["delta_rows"] >= 1
    assert c.get(["d10"])[0] is None and c.get(["late"])[0] is not None
    assert report["documents"] == 59
    got = c.get(["late"], with_vectors=True)[0].vectors["dense"]
    from polyindex.types import document_text
    want = c.encoding.encoder.encode([document_text(None, "a late document about fish")])[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    eng.close()


@pytest.mark.slow
def test_a_damaged_encoder_file_is_data_loss_naming_it(tmp_path, cli):
    eng = polyindex.open(tmp_path / "d")
    adapt(make(eng))
    eng.close()
    weights = tmp_path / "d" / "c" / "encoders" / "v2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x40
    weights.write_bytes(bytes(data))
    with pytest.raises(Corrupt, match="model.safetensors.*checksum mismatch"):
        polyindex.open(tmp_path / "d").collection("c")
    r = cli("query", "--data", tmp_path / "d", "--collection", "c", "fish", "--profile", "dense")
    assert r.returncode != 0 and "DATA_LOSS" in r.stderr and "model.safetensors" in r.stderr
    r = cli("verify", "--data", tmp_path / "d")
    assert r.returncode != 0 and "model.safetensors" in r.stdout + r.stderr


@pytest.mark.slow
def test_the_shipped_ranker_reads_the_adapted_scores(tmp_path):
    eng = polyindex.open(tmp_path / "d")
    c = make(eng)
    adapt(c)
    hits = c.query("fish water", k=5, profile="ltr", explain=True)
    assert len(hits) == 5
    vecs = {d.id: d.vectors["dense"] for d in c.get([h.id for h in hits], with_vectors=True)}
    q = c.encoding.encoder.encode(["fish water"])[0]
    for h in hits:  # the ranker's dense feature is the adapted encoder's cosine
        feats = h.explain["rerank"]["features"]
        assert feats["dense_cos"] == pytest.approx(float(q @ vecs[h.id]), abs=1e-4)
    eng.close()


@pytest.mark.slow
def test_snapshot_of_an_adapted_collection_carries_its_encoder(tmp_path):
    eng = polyindex.open(tmp_path / "d")
    c = make(eng)
    adapt(c)
    adapted = answers(c)
    c.snapshot(tmp_path / "snap")
    eng.restore_snapshot(tmp_path / "snap", name="r")
    assert answers(eng.collection("r")) == adapted
    eng.close()


# -- kill -9 at every phase ----------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import sys, polyindex
    sys.path.insert(0, {tests!r})
    from test_adapt_store import perturb_learner
    from polyindex.adapt.run import adapt
    eng = polyindex.open({data!r})
    adapt(eng.collection("c"), learner=perturb_learner)
    eng.close()
""")


def run_adapt(data: Path, failpoint: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("POLYINDEX_FAILPOINTS", None)
    if failpoint:
        env["POLYINDEX_FAILPOINTS"] = f"{failpoint}=crash"
    code = SCRIPT.format(tests=str(Path(__file__).parent), data=str(data))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def adapted_reference(tmp_path_factory):
    """A collection, its answers before and after a complete adapt."""
    root = tmp_path_factory.mktemp("ref")
    eng = polyindex.open(root / "base")
    make(eng)
    eng.close()
    shutil.copytree(root / "base", root / "done")
    r = run_adapt(root / "done", None)
    assert r.returncode == 0, r.stderr[-3000:]
    eng = polyindex.open(root / "base")
    before = answers(eng.collection("c"))
    eng.close()
    eng = polyindex.open(root / "done")
    after = answers(eng.collection("c"))
    eng.close()
    assert before != after
    return root, before, after


@pytest.mark.slow
@pytest.mark.parametrize("point, committed, rerun", [
    ("adapt.learn.before", False, False),     # learning starts
    ("adapt.encoder.rename", False, False),   # the learned encoder being put in place
    ("adapt.segment.rename", False, True),    # re-encoding: a rebuilt segment put in place
    ("adapt.manifest.rename", False, True),   # the commit's rename itself
    ("adapt.commit.after", True, False),      # committed, old files not yet removed
])
def test_kill_9_at_any_phase_leaves_the_old_or_the_new_collection(adapted_reference, tmp_path,
                                                                  point, committed, rerun):
    root, before, after = adapted_reference
    data = tmp_path / "d"
    shutil.copytree(root / "base", data)
    r = run_adapt(data, point)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    eng = polyindex.open(data)
    c = eng.collection("c")
    assert answers(c) == (after if committed else before)
    assert c.info()["encoder"] == ("v2" if committed else "base")
    eng.close()
    if rerun:  # resumes (the encoder learned, the segments rebuilt) and ends adapted
        r = run_adapt(data, None)
        assert r.returncode == 0, r.stderr[-3000:]
        eng = polyindex.open(data)
        assert answers(eng.collection("c")) == after
        eng.close()


@pytest.mark.slow
def test_an_online_collection_seals_its_buffer_and_never_mixes_encoders(tmp_path):
    from polyindex.engine import Engine
    eng = Engine(tmp_path / "d", online=True)
    c = make(eng)
    added = []

    def progress(phase, done=None, total=None, *rest):
        if phase == "re-encoding" and not added:  # acknowledged, buffered in the WAL
            added.append(c.add([{"id": "late", "text": "a late document about fish"}]))
    adapt(c, progress=progress)
    assert added and c.live.writes.active.empty()
    c.add([{"id": "after", "text": "written after the adapt"}])  # buffered: new encoder
    from polyindex.types import document_text
    for i, text in (("late", "a late document about fish"), ("after", "written after the adapt")):
        got = c.get([i], with_vectors=True)[0].vectors["dense"]
        want = c.encoding.encoder.encode([document_text(None, text)])[0]
        np.testing.assert_allclose(got, want, atol=1e-5)
    eng.close()


def test_the_admin_rpc_is_token_protected_and_refuses_with_a_clear_status(tmp_path):
    import grpc
    from conftest import start_server, stop_server
    from polyindex.client import Client
    eng = polyindex.open(tmp_path / "d")
    eng.create_collection("v", ["dense:Flat"], model=None).add(
        [{"id": "a", "vector": [1.0, 0.0]}, {"id": "b", "vector": [0.0, 1.0]}])
    eng.close()
    (tmp_path / "token").write_text("s3cret\n")
    proc, address = start_server(tmp_path / "d", "--port", "7741",
                                 "--token-file", tmp_path / "token")
    try:
        with pytest.raises(Exception) as no_token:
            Client(address).collection("v").adapt()
        assert "UNAUTHENTICATED" in str(no_token.value) or "token" in str(no_token.value)
        with pytest.raises(FailedPrecondition, match="no text model"):
            Client(address, token="s3cret").collection("v").adapt()
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_re_encoding_on_ray_gives_the_local_answers(tmp_path):
    pytest.importorskip("ray", reason="the extra polyindex[ray]")
    eng = polyindex.open(tmp_path / "d")
    local, on_ray = make(eng, "local"), make(eng, "ray")
    adapt(local)
    report = adapt(on_ray, ray={"encoders": 1})
    assert report["reencoded_rows"] == 60 and report["encoder"] == "v2"
    assert answers(on_ray) == answers(local)
    eng.close()


@pytest.mark.slow
def test_index_adapt_with_the_real_learner_then_revert_gives_the_plain_index(tmp_path, cli):
    """The CLI end to end with ``adapt.learn`` on tiny settings: ``index --adapt`` makes an
    adapted collection, ``adapt --revert`` makes it answer as one never adapted."""
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in corpus(240)))
    tiny = ["--recipe", "max_steps=2", "--recipe", "min_docs=50", "--recipe", "min_pairs=4",
            "--recipe", "batch_size=8"]
    forced = ["--recipe", "guard_margin=-1"]  # 2 steps need not beat the base: commit anyway
    r = cli("index", src, "--data", tmp_path / "plain", "--collection", "c", "--no-progress",
            "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    r = cli("index", src, "--data", tmp_path / "d", "--collection", "c", "--dtype", "float32",
            "--adapt", *tiny, *forced, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)["adapt"]
    assert report["encoder"] == "v2" and report["learn"]["steps"] == 2
    assert report["committed"] is True and report["learn"]["guard"]["served"] == "fused"
    assert "adapt: re-encoding" in r.stderr  # progress with a rate and an ETA
    eng = polyindex.open(tmp_path / "plain")
    plain = answers(eng.collection("c"))
    eng.close()
    eng = polyindex.open(tmp_path / "d")
    assert answers(eng.collection("c")) != plain
    eng.close()
    r = cli("adapt", "--data", tmp_path / "d", "--collection", "c", "--revert")
    assert r.returncode == 0 and "reverted 'c': encoder base (was v2)" in r.stdout, r.stderr
    eng = polyindex.open(tmp_path / "d")
    assert answers(eng.collection("c")) == plain
    eng.close()
    # a margin no student can meet: the guard refuses, the collection stays as it is
    r = cli("adapt", "--data", tmp_path / "d", "--collection", "c", *tiny, "--recipe",
            "guard_margin=100")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not adapted 'c'" in r.stdout and "held-back synthetic queries" in r.stdout
    eng = polyindex.open(tmp_path / "d")
    assert answers(eng.collection("c")) == plain and eng.collection("c").info()["encoder"] == "base"
    eng.close()
    r = cli("adapt", "--data", tmp_path / "d", "--collection", "c", "--recipe", "nope=1")
    assert r.returncode == 2 and "nope" in r.stderr
