"""Storage and data model: manifest commits, Arrow segments, tombstones and snapshots, upserts,
collection names, bad input through the CLI, and resuming bulk runs."""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import polyindex
from polyindex.index.protocol import Query
from polyindex.query.pipeline import run
from polyindex.query.profiles import resolve_profile
from polyindex.storage.manifest import FORMAT_VERSION, MANIFEST, load_manifest
from polyindex.storage.segment import Segment


@pytest.fixture
def eng(tmp_path):
    return polyindex.open(tmp_path / "D")


@pytest.fixture
def coll(eng):
    """A lexical collection with three documents in one segment."""
    c = eng.create_collection("c", ["lexical"])
    c.add([{"_id": "a", "text": "apple orchard"}, {"_id": "b", "text": "banana plantation"},
           {"_id": "k", "text": "kiwi farm"}])
    return c


def lexical_ids(c, text: str, k: int = 10) -> list[str]:
    return [h.id for h in c.query(text, k=k, profile="lexical")]


# ---------------------------------------------------------------- manifest

def test_manifest_commits_are_atomic_and_versioned(coll):
    path = coll.folder / MANIFEST
    seen_bad: list[str] = []
    stop = threading.Event()

    def reader():  # a concurrent reader must only ever see a whole manifest
        while not stop.is_set():
            raw = path.read_bytes()
            try:
                json.loads(raw)
            except ValueError:
                seen_bad.append(raw[:80].decode(errors="replace"))

    t = threading.Thread(target=reader)
    t.start()
    try:
        version = json.loads(path.read_bytes())["version"]
        for i in range(15):
            coll.add([{"_id": f"n{i}", "text": f"note {i}"}])
            data = json.loads(path.read_bytes())
            assert data["version"] == version + 1
            assert data["format_version"] == FORMAT_VERSION
            version = data["version"]
    finally:
        stop.set()
        t.join()
    assert seen_bad == []
    assert load_manifest(coll.folder).version == version
    assert not [p.name for p in coll.folder.iterdir() if ".tmp" in p.name]  # no temp left


def test_newer_format_version_is_refused(eng, coll, cli, tmp_path):
    path = coll.folder / MANIFEST
    data = json.loads(path.read_bytes())
    data["format_version"] = FORMAT_VERSION + 41
    path.write_text(json.dumps(data))
    with pytest.raises(polyindex.Corrupt) as exc:
        polyindex.open(tmp_path / "D", readonly=True).collection("c")
    msg = str(exc.value)
    assert f"format_version {FORMAT_VERSION + 41}" in msg and "upgrade" in msg
    assert str(path) in msg
    res = cli("info", "--data", tmp_path / "D", "--collection", "c")
    assert res.returncode == 1 and "upgrade" in res.stderr and "DATA_LOSS" in res.stderr


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "not-an-object", "no-version",
                                    "bad-segments", "bad-collection"])
def test_damaged_manifest_is_corrupt_naming_the_file(coll, tmp_path, damage):
    path = coll.folder / MANIFEST
    raw = path.read_bytes()
    data = json.loads(raw)
    damaged = {
        "truncated": raw[: len(raw) // 2],
        "garbage": b"\x00\xff\xfe garbage \x80",
        "empty": b"",
        "not-an-object": b"[1, 2, 3]",
        "no-version": json.dumps({**data, "version": None}).encode(),
        "bad-segments": json.dumps({**data, "segments": [{"id": "seg-000000"}]}).encode(),
        "bad-collection": json.dumps({**data, "collection": {"name": "../evil"}}).encode(),
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(polyindex.Corrupt) as exc:
        polyindex.open(tmp_path / "D", readonly=True).collection("c")
    assert str(path) in str(exc.value)


# ---------------------------------------------------------------- segments

def test_segments_are_memory_mapped_arrow_ipc(coll):
    m = load_manifest(coll.folder)
    assert len(m.segments) == 1
    entry = m.segments[0]
    path = coll.folder / "segments" / entry.id / "docs.arrow"
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    assert table.num_rows == entry.n_rows == 3
    for name in ("id", "title", "text", "metadata_json"):
        assert table.schema.field(name).type == pa.string()
    assert "embedding" not in table.column_names  # lexical only: nothing encoded
    assert table.column("id").to_pylist() == ["a", "b", "k"]
    # Zero-copy: opening a segment allocates no buffers for its columns (they point into the map).
    before = pa.total_allocated_bytes()
    seg = Segment(path.parent, entry.id, entry.n_rows)
    assert seg.table.column("text").to_pylist()[0] == "apple orchard"
    assert pa.total_allocated_bytes() - before < 1024
    for name in ("lexical.vocab.arrow", "lexical.postings.arrow", "lexical.doclen.arrow"):
        pa.ipc.open_file(pa.memory_map(str(path.parent / name))).read_all()


def test_dense_segment_embedding_column_and_typed_fields(eng):
    c = eng.create_collection("v", ["lexical", "dense"], fields={"year": "int"})
    c.add([{"_id": "x", "text": "the cat sat on the mat", "year": 1999},
           {"_id": "y", "text": "stock markets fell sharply", "year": 2020},
           {"_id": "z", "text": "a kitten on a rug"}])
    entry = load_manifest(c.folder).segments[0]
    seg = c.folder / "segments" / entry.id
    table = pa.ipc.open_file(pa.memory_map(str(seg / "docs.arrow"))).read_all()
    # Each vector stored once: the Flat index keeps them, so docs.arrow has no copy ...
    assert "embedding" not in table.column_names
    vectors = c.view().segments[0].indexes["dense"].matrix()
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    # ... unless another kind reads embeddings from the documents (the tree does)
    t = eng.create_collection("t", ["dense", "tree"])
    t.add([{"_id": "x", "text": "the cat sat on the mat"}])
    t_seg = t.folder / "segments" / load_manifest(t.folder).segments[0].id
    emb_type = pa.ipc.open_file(pa.memory_map(str(t_seg / "docs.arrow"))).schema.field(
        "embedding").type
    assert pa.types.is_fixed_size_list(emb_type)
    assert emb_type.value_type == pa.float32() and emb_type.list_size == 384
    # The model normalizes in bfloat16: each component is off by at most its unit roundoff
    # (2**-8 relative), so the norm is too; a looser test would miss an unnormalized vector.
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=2.0 ** -8)
    assert table.schema.field("year").type == pa.int64()
    assert table.column("year").to_pylist() == [1999, 2020, None]
    assert (seg / "dense.faiss").is_file()
    assert c.query("a cat on a mat", k=1, profile="dense")[0].id == "x"


# ---------------------------------------------------------------- tombstones and snapshots

def test_delete_tombstones_rows_everywhere(coll):
    version = load_manifest(coll.folder).version
    assert coll.delete(["a", "nope"]) == 1
    assert coll.count() == 2
    assert coll.get(["a", "b"])[0] is None and coll.get(["b"])[0].text == "banana plantation"
    assert lexical_ids(coll, "apple orchard") == []
    assert lexical_ids(coll, "banana") == ["b"]
    m = load_manifest(coll.folder)
    assert m.version == version + 1 and m.segments[0].n_deleted == 1
    tomb = pa.ipc.open_file(pa.memory_map(str(coll.folder / m.segments[0].tombstones))).read_all()
    assert tomb.column("row").to_pylist() == [0]
    # Deleting again (or deleting unknown ids) changes nothing and commits nothing.
    assert coll.delete(["a"]) == 0
    assert coll.delete(["nope"]) == 0
    assert load_manifest(coll.folder).version == version + 1
    assert coll.count() == 2
    # A reader (another process, say) sees the same.
    again = polyindex.open(coll.folder.parent, readonly=True).collection("c")
    assert again.count() == 2 and again.get(["a"]) == [None]
    with pytest.raises(polyindex.InvalidArgument):
        coll.delete("b")  # a bare string is not a list of ids


def test_old_snapshot_keeps_seeing_old_data(coll):
    snap = coll.view()
    prof = resolve_profile("lexical", list(coll.kinds), {})
    assert coll.delete(["a", "b"]) == 2
    coll.add([{"_id": "k", "text": "kiwi replaced"}, {"_id": "n", "text": "new apple"}])
    # The old snapshot: unchanged count, rows, live masks and query results.
    assert snap.count() == 3
    assert [loc is not None for loc in snap.find(["a", "b", "k", "n"])] == [True, True, True, False]
    assert all(live is None or live.all() for live in snap.live)
    assert [h.id for h in run(snap, [Query(text="apple")], prof, 10)[0]] == ["a"]
    hit = run(snap, [Query(text="kiwi")], prof, 10, with_text=True)[0]
    assert [(h.id, h.text) for h in hit] == [("k", "kiwi farm")]
    # The collection itself moved on.
    new = coll.view()
    assert new is not snap and new.version > snap.version
    assert coll.count() == 2
    assert lexical_ids(coll, "apple") == ["n"]
    assert coll.get(["k"])[0].text == "kiwi replaced"


# ---------------------------------------------------------------- upserts

def test_upsert_replaces_the_document(coll):
    coll.add([{"_id": "a", "text": "apricot jam"}])
    assert coll.count() == 3
    assert coll.get(["a"])[0].text == "apricot jam"
    assert lexical_ids(coll, "orchard") == []
    assert lexical_ids(coll, "apricot") == ["a"]
    assert sum(s.n_deleted for s in load_manifest(coll.folder).segments) == 1


def test_duplicates_in_one_batch_last_wins(coll):
    n = coll.add([{"_id": "d", "text": "first draft"}, {"_id": "e", "text": "elder"},
                  {"_id": "d", "text": "second draft"}, {"_id": "b", "text": "blueberry"},
                  {"_id": "d", "text": "final version"}])
    assert n == 3
    assert coll.count() == 5
    assert [d.text for d in coll.get(["d", "e", "b"])] == ["final version", "elder", "blueberry"]
    assert lexical_ids(coll, "draft") == [] and lexical_ids(coll, "banana") == []
    assert lexical_ids(coll, "final") == ["d"]
    seg = load_manifest(coll.folder).segments[-1]
    assert seg.n_rows == 3  # duplicates never reach the segment


# ---------------------------------------------------------------- collection names

@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "x" * 200, "..", "a\\b", "a b",
                                  "/abs", "x\x00y", None, 7])
def test_invalid_collection_names(eng, tmp_path, name):
    with pytest.raises(polyindex.InvalidArgument):
        eng.create_collection(name, ["lexical"])
    with pytest.raises(polyindex.InvalidArgument):
        eng.collection(name)
    assert not (tmp_path / "x").exists()
    assert [p.name for p in (tmp_path / "D").iterdir()] == [".lock"]  # the writer's lock only


def test_create_twice_and_unknown_collection(eng):
    eng.create_collection("alpha", ["lexical"])
    eng.create_collection("beta-2.x", ["lexical"])
    with pytest.raises(polyindex.AlreadyExists):
        eng.create_collection("alpha", ["lexical"])
    assert eng.create_collection("alpha", ["lexical"], exist_ok=True).name == "alpha"
    with pytest.raises(polyindex.NotFound) as exc:
        eng.collection("gamma")
    assert "gamma" in str(exc.value) and "alpha, beta-2.x" in str(exc.value)
    assert eng.list_collections() == ["alpha", "beta-2.x"]


# ---------------------------------------------------------------- bad input through the CLI

GOOD = [{"_id": "g1", "text": "good one"}, {"_id": "g2", "text": "good two"}]
BAD_LINE3 = {
    "malformed": (b'{"_id": "bad", "text": oops}', ["malformed JSON"]),
    "utf8": (b'{"_id": "bad", "text": "caf\xe9"}', ["invalid UTF-8"]),
    "no-text": (b'{"_id": "bad", "title": "only a title"}', ["missing text", "id='bad'", "'text'"]),
    "id-type": (b'{"_id": 1.5, "text": "float id"}', ["id must be a string or an integer", "'_id'"]),
    "id-list": (b'{"_id": ["x"], "text": "list id"}', ["id must be a string or an integer", "'_id'"]),
}


def bad_file(path: Path, line3: bytes) -> Path:
    good = b"".join(json.dumps(r).encode() + b"\n" for r in GOOD)
    path.write_bytes(good + line3 + b'\n{"_id": "g4", "text": "after the bad line"}\n')
    return path


@pytest.mark.parametrize("kind", sorted(BAD_LINE3))
def test_bad_record_fails_the_batch_and_commits_nothing(kind, tmp_path, cli):
    line3, words = BAD_LINE3[kind]
    src = bad_file(tmp_path / f"{kind}.jsonl", line3)
    data = tmp_path / "D"
    # A collection with earlier content: the failing run must leave it exactly as it was.
    with polyindex.open(data) as setup:  # closed: the CLI below is the next writer
        prev = setup.create_collection("prev", ["lexical"], segment_size=1000)
        prev.add([{"_id": "g1", "text": "previous version"}, {"_id": "p", "text": "kept"}])
        version = load_manifest(prev.folder).version
    for name in ("fresh", "prev"):
        res = cli("index", src, "--data", data, "--collection", name, "--index", "lexical",
                  "--segment-size", 1000, "--no-progress")
        assert res.returncode == 2, res.stderr
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1, err  # one line, not folded at the terminal width
        assert re.search(re.escape(f"{src}:3") + r"[:,]", err), err  # file:line
        for w in words:
            assert w in err, err
    assert "fresh" not in polyindex.open(data, readonly=True).list_collections()  # dropped
    prev = polyindex.open(data, readonly=True).collection("prev")
    assert load_manifest(prev.folder).version == version
    assert prev.count() == 2
    assert [d.text for d in prev.get(["g1", "p"])] == ["previous version", "kept"]
    assert prev.get(["g2", "g4"]) == [None, None]


def test_skip_invalid_indexes_the_good_rows_and_counts_the_bad(tmp_path, cli):
    src = tmp_path / "mixed.jsonl"
    lines = [json.dumps(GOOD[0]).encode()] + [b for b, _ in BAD_LINE3.values()] + \
        [json.dumps(GOOD[1]).encode(), b"", b'{"id": 42, "text": "integer ids are fine"}']
    src.write_bytes(b"\n".join(lines) + b"\n")
    data = tmp_path / "D"
    res = cli("index", src, "--data", data, "--collection", "c", "--index", "lexical",
              "--skip-invalid", "--json", "--no-progress")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["skipped_invalid"] == len(BAD_LINE3)
    assert report["indexed"] == report["documents"] == 3
    c = polyindex.open(data, readonly=True).collection("c")
    assert [d.text for d in c.get(["g1", "g2", "42"])] == ["good one", "good two",
                                                          "integer ids are fine"]
    assert c.get(["bad"]) == [None]


@pytest.mark.parametrize("factory,words", [
    ("dense:Bogus42", ["dense", "'Bogus42'", "not a valid faiss index factory string"]),
    ("nosuchkind", ["unknown index kind 'nosuchkind'", "dense", "lexical"]),
    ("lexical:k1=abc", ["k1", "'abc'"]),
])
def test_unknown_factory_string(factory, words, tmp_path, cli):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps(GOOD[0]) + "\n")
    res = cli("index", src, "--data", tmp_path / "D", "--collection", "c", "--index", factory,
              "--no-progress")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert err.startswith("error (INVALID_ARGUMENT)") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    assert polyindex.open(tmp_path / "D").list_collections() == []  # nothing created


def test_unknown_profile_in_query_lists_the_profiles(coll, cli):
    res = cli("query", "apple", "--data", coll.folder.parent, "--collection", "c",
              "--profile", "nope")
    assert res.returncode == 2
    assert "unknown rank profile 'nope'" in res.stderr and "lexical" in res.stderr
    ok = cli("query", "apple", "--data", coll.folder.parent, "--collection", "c",
             "--profile", "lexical", "--json")
    assert ok.returncode == 0, ok.stderr
    assert [h["id"] for h in json.loads(ok.stdout)] == ["a"]


# ---------------------------------------------------------------- resume

def test_completed_run_is_not_redone_and_force_reindexes(tmp_path, corpus, cli):
    records = corpus.make(tmp_path / "corpus.jsonl", 500, seed=3)
    distinct = len({r["_id"] for r in records})
    data = tmp_path / "D"
    args = ["index", tmp_path / "corpus.jsonl", "--data", data, "--collection", "c",
            "--index", "lexical", "--segment-size", 100, "--no-progress", "--json"]
    first = json.loads(cli(*args).stdout)
    assert first["already_indexed"] is False and first["documents"] == distinct
    folder = data / "c"
    before = load_manifest(folder)

    res = cli(*args)
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert again["already_indexed"] is True and again["indexed"] == 0 and again["segments"] == 0
    assert again["documents"] == distinct
    after = load_manifest(folder)
    assert after.version == before.version
    assert [s.to_json() for s in after.segments] == [s.to_json() for s in before.segments]

    res = cli(*args, "--force")
    assert res.returncode == 0, res.stderr
    forced = json.loads(res.stdout)
    assert forced["already_indexed"] is False and forced["resumed_from"] == 0
    assert forced["indexed"] == first["indexed"] and forced["documents"] == distinct
    m = load_manifest(folder)
    assert m.version > before.version and len(m.segments) == 2 * len(before.segments)
    assert m.live_rows() == distinct
    assert all(s.n_deleted == s.n_rows for s in m.segments[: len(before.segments)])
    c = polyindex.open(data, readonly=True).collection("c")
    last = corpus.last(records)
    assert [d.text for d in c.get(list(last))] == [r["text"] for r in last.values()]
