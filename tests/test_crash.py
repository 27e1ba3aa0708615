"""Crash safety of bulk indexing: kill -9 the CLI at random moments, check, resume, check.

Each run indexes a JSONL corpus with upserts (ids repeated later in the file) and is killed
with SIGKILL at a moment drawn from its seed (see ``kill_schedule``): a delay measured from the
start or from a chosen manifest commit, scaled by the measured timings of a full run, so that
kills land before the collection exists, before the first commit, while segments are built
and committed, and after the final commit. After the kill the committed state must be exactly the
documents of the committed prefix of the file (every segment intact); after resuming, exactly
the corpus (last write wins, no duplicates), and the report must say where it resumed.
"""
from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest

import polyindex
from polyindex.storage.manifest import MANIFEST, load_manifest
from polyindex.types import document_text

N_DOCS = 3000
SEGMENT = 200
N_RUNS = 20
MIN_DELAY = 0.3
DONE = 10**6  # committed_version() once the final commit (ingest done) is in


def index_args(corpus_path: Path, data: Path, *extra) -> list:
    return ["index", corpus_path, "--data", data, "--collection", "c", "--no-progress", *extra]


LEXICAL = ("--index", "lexical", "--segment-size", SEGMENT)


@pytest.fixture(scope="module")
def timings(tmp_path_factory, corpus, cli) -> dict:
    """Measured milestones of a complete run of the same shape (after a warm-up run).

    ``create``: seconds from start to the collection's creation (manifest version 1);
    ``first``: to the first segment commit (version 2); ``segment``: seconds between segment
    commits; ``full``: the whole run.
    """
    tmp = tmp_path_factory.mktemp("timing")
    corpus.make(tmp / "corpus.jsonl", N_DOCS, seed=12345)
    warm = cli(*index_args(tmp / "corpus.jsonl", tmp / "W", *LEXICAL))
    assert warm.returncode == 0, warm.stderr
    args = index_args(tmp / "corpus.jsonl", tmp / "D", *LEXICAL)
    t0 = time.monotonic()
    proc = subprocess.Popen(cli.command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    commits: dict[int, float] = {}
    while proc.poll() is None:
        n = committed_version(tmp / "D" / "c")
        if n and n not in commits:
            commits[n] = time.monotonic() - t0
        time.sleep(0.005)
    full = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr.read().decode()
    seen = sorted(n for n in commits if 2 <= n < DONE)
    first = commits[seen[0]] if seen else full / 2
    create = commits.get(1, first)
    segment = (commits[seen[-1]] - first) / (seen[-1] - seen[0]) if len(seen) > 1 else 0.05
    return {"create": round(create, 3), "first": round(first, 3),
            "segment": round(max(segment, 0.01), 3), "full": round(full, 3)}


def committed_version(folder: Path) -> int:
    """The committed manifest version (0: no collection yet; DONE: the run's final commit)."""
    try:
        manifest = load_manifest(folder)
    except FileNotFoundError:
        return 0
    return DONE if manifest.ingest and manifest.ingest["done"] else manifest.version


def kill_at(argv: list[str], folder: Path, version: int, extra: float) -> str:
    """Start the command; SIGKILL it ``extra`` seconds after manifest ``version`` is committed
    (0: after the start; 1: the collection's creation; n: n - 1 segments; DONE: the final
    commit). Returns 'killed' or 'finished'."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while (version and proc.poll() is None and time.monotonic() < deadline
           and committed_version(folder) < version):
        time.sleep(0.005)
    time.sleep(extra)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return "killed"
    assert proc.returncode == 0, proc.stderr.read().decode()
    return "finished"


def kill_schedule(seed: int, t: dict) -> tuple[int, float]:
    """(manifest version to wait for, then seconds to wait) for one run, from its seed.

    A quarter of the runs use a plain delay from the start, between MIN_DELAY and the measured
    time of a full run (importing, creating the collection, building, committing, done). As
    machine load moves those around, the others are anchored on commits so that every phase
    is always hit: two wait for the collection's creation and then part of the time to the
    first commit; most wait for a random number of committed segments and then a random
    part of a segment interval (the kill lands while a segment is built, renamed, tombstoned
    or committed); two wait for the final commit (killed before the process exits).
    """
    rng = random.Random(seed)
    n_segments = -(-N_DOCS // SEGMENT)
    if seed % 4 == 0:
        return 0, rng.uniform(MIN_DELAY, max(t["full"], MIN_DELAY + 0.05))
    if seed % 10 == 9:
        return DONE, 0.0
    if seed % 10 == 5:
        return 1, rng.uniform(0, 0.5 * max(t["first"] - t["create"], 0.01)) if seed > 9 else 0.0
    return 1 + rng.randint(1, n_segments - 2), rng.uniform(0, 1.5 * t["segment"])


def check_segments_intact(folder: Path, manifest, dense: bool = False) -> None:
    """Every listed segment's files open and agree with the manifest."""
    for entry in manifest.segments:
        seg = folder / "segments" / entry.id
        table = pa.ipc.open_file(pa.memory_map(str(seg / "docs.arrow"))).read_all()
        assert table.num_rows == entry.n_rows, entry.id
        assert len(set(table.column("id").to_pylist())) == entry.n_rows  # unique within a segment
        for name in ("lexical.vocab.arrow", "lexical.postings.arrow", "lexical.doclen.arrow"):
            pa.ipc.open_file(pa.memory_map(str(seg / name))).read_all()
        assert "lexical" in entry.indexes
        if dense:
            import faiss
            assert "dense" in entry.indexes
            index = faiss.read_index(str(seg / "dense.faiss"))
            assert index.ntotal == entry.n_rows and index.d == 384
            # each vector stored once: the Flat index keeps them, docs.arrow has no copy
            assert "embedding" not in table.column_names
        if entry.tombstones:
            rows = pa.ipc.open_file(pa.memory_map(str(folder / entry.tombstones))).read_all()
            assert rows.num_rows == entry.n_deleted
        assert 0 <= entry.n_deleted <= entry.n_rows


def live_ids(coll) -> list[str]:
    """Every live row's id, over all segments of the current snapshot (duplicates kept)."""
    snap = coll.view()
    out: list[str] = []
    for seg, live in zip(snap.segments, snap.live):
        ids = seg.docs.ids
        out.extend((ids if live is None else ids[live]).tolist())
    return out


def check_content(coll, expected: dict[str, dict], absent: set[str]) -> None:
    """The collection holds exactly ``expected`` (last versions) and none of ``absent``."""
    assert coll.count() == len(expected)
    ids = live_ids(coll)
    assert len(ids) == len(set(ids)) == len(expected), "duplicate live rows"
    assert set(ids) == set(expected)
    keys = list(expected)
    for doc_id, doc in zip(keys, coll.get(keys)):
        assert doc is not None, doc_id
        assert (doc.text, doc.title) == (expected[doc_id]["text"], expected[doc_id]["title"]), doc_id
    if absent:
        assert coll.get(sorted(absent)) == [None] * len(absent)


def check_queries(coll, records: list[dict], expected: dict[str, dict], profile=None) -> None:
    """The newest version of a few docs is found by its unique token; replaced versions not."""
    hits = coll.query("river ocean", k=5, profile=profile)
    assert len(hits) == min(5, len(expected))
    assert all(h.id in expected for h in hits)
    latest = {id(r) for r in expected.values()}
    replaced = [r for r in records if id(r) not in latest]
    for rec in list(expected.values())[-3:] + replaced[-3:]:
        token = rec["text"].split()[0]
        hits = coll.query(token, k=3, profile="lexical")
        if id(rec) in latest:
            assert hits and hits[0].id == rec["_id"], token
        else:  # only a tombstoned row holds this token
            assert hits == [], (token, hits)


def check_after_kill(data: Path, records: list[dict], dense: bool = False) -> tuple[str, int, bool]:
    """Committed state = the committed prefix of the file. Returns (phase, position, done)."""
    if not data.exists():  # killed before the CLI made the data directory
        return "before-create", 0, False
    eng = polyindex.open(data, readonly=True)
    if "c" not in eng.list_collections():
        assert not (data / "c" / MANIFEST).exists()
        return "before-create", 0, False
    coll = eng.collection("c")
    manifest = load_manifest(coll.folder)
    check_segments_intact(coll.folder, manifest, dense)
    position = manifest.ingest["position"] if manifest.ingest else 0
    done = bool(manifest.ingest and manifest.ingest["done"])
    committed = records[:position]
    expected = {r["_id"]: r for r in committed}
    check_content(coll, expected, {r["_id"] for r in records[position:]} - set(expected))
    coll.view()  # opens every segment's indexes
    if expected:
        check_queries(coll, committed, expected)
    else:
        assert coll.query("river", k=5) == []
    phase = "done" if done else ("mid-run" if manifest.segments else "before-first-commit")
    return phase, position, done


def resume_and_check(cli, args: list, data: Path, records: list[dict], position: int,
                     done: bool, dense: bool = False) -> dict:
    res = cli(*args, "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    if done:
        assert report["already_indexed"] is True and report["indexed"] == 0
    else:
        assert report["already_indexed"] is False
        assert report["resumed_from"] == position
    expected = {r["_id"]: r for r in records}
    assert report["documents"] == len(expected)
    coll = polyindex.open(data, readonly=True).collection("c")
    manifest = load_manifest(coll.folder)
    check_segments_intact(coll.folder, manifest, dense)
    assert manifest.ingest["done"] is True and manifest.ingest["position"] == len(records)
    assert manifest.live_rows() == len(expected)
    # Nothing uncommitted is left behind: the segment folders are exactly the listed ones.
    assert sorted(p.name for p in (coll.folder / "segments").iterdir()) == \
        sorted(s.id for s in manifest.segments)
    check_content(coll, expected, set())
    check_queries(coll, records, expected)
    return report


@pytest.mark.parametrize("seed", range(N_RUNS))
def test_kill9_during_bulk_index_then_resume(seed, tmp_path, corpus, cli, timings):
    records = corpus.make(tmp_path / "corpus.jsonl", N_DOCS, seed)
    data = tmp_path / "D"
    args = index_args(tmp_path / "corpus.jsonl", data, *LEXICAL)
    after, extra = kill_schedule(seed, timings)
    outcome = kill_at(cli.command(*args), data / "c", after, extra)
    phase, position, done = check_after_kill(data, records)
    print(f"seed {seed}: after version {after} + {extra:.2f}s ({timings}): {outcome}, {phase}, "
          f"committed position {position}")
    if outcome == "finished":
        assert done
    resume_and_check(cli, args, data, records, position, done)


DENSE_DOCS = 600
DENSE_SEGMENT = 100


@pytest.mark.slow  # ~35 s each: the CLI loads torch and the model twice (killed run, resume)
@pytest.mark.parametrize("seed", [0, 1])
def test_kill9_dense_bulk_index_then_resume(seed, tmp_path, corpus, cli):
    records = corpus.make(tmp_path / "corpus.jsonl", DENSE_DOCS, seed + 100, words=8)
    data = tmp_path / "D"
    args = index_args(tmp_path / "corpus.jsonl", data, "--index", "lexical", "--index", "dense",
                      "--segment-size", DENSE_SEGMENT)
    # Dense runs are long (model load + encoding): kill after a chosen number of commits.
    rng = random.Random(seed)
    outcome = kill_at(cli.command(*args), data / "c", 2 + 2 * seed, rng.uniform(0, 0.6))
    phase, position, done = check_after_kill(data, records, dense=True)
    print(f"dense seed {seed}: {outcome}, {phase}, committed position {position}")
    resume_and_check(cli, args, data, records, position, done, dense=True)
    # Embeddings stayed aligned with their rows across the crash: a document's own text is
    # its nearest neighbour under the dense profile.
    coll = polyindex.open(data, readonly=True).collection("c")
    expected = {r["_id"]: r for r in records}
    for rec in list(expected.values())[:: len(expected) // 5][:5]:
        hits = coll.query(document_text(rec["title"], rec["text"]), k=1, profile="dense")
        assert hits[0].id == rec["_id"] and hits[0].score > 0.98, (rec, hits)
    # each vector stored once: in the Flat index (no docs.arrow copy), 384-d
    assert "embedding" not in coll.view().segments[0].docs.table.column_names
    assert coll.view().segments[0].indexes["dense"].matrix().shape[1] == 384


def test_uncommitted_segment_leftovers_are_removed_and_never_visible(tmp_path):
    eng = polyindex.open(tmp_path / "D")
    coll = eng.create_collection("c", ["lexical"])
    coll.add([{"_id": f"a{i}", "text": f"apple number{i}"} for i in range(5)])
    folder = coll.folder
    nxt = load_manifest(folder).next_segment
    segs = folder / "segments"
    # A crash between build and commit: a temp folder, a renamed-but-uncommitted folder
    # (with the very id the next segment will get), and an unrelated junk one.
    leftovers = [segs / ".seg-000099.tmp", segs / "seg-000099", segs / f"seg-{nxt:06d}"]
    for d in leftovers:
        d.mkdir()
        (d / "docs.arrow").write_bytes(b"junk, not arrow")
        (d / "lexical.vocab.arrow").write_bytes(b"\x00" * 10)
    (segs / ".seg-000099.tmp" / "half").write_bytes(b"x")

    # Never visible: a fresh reader sees the committed state only and is not disturbed.
    fresh = polyindex.open(tmp_path / "D", readonly=True).collection("c")
    assert fresh.count() == 5
    assert [h.id for h in fresh.query("apple", k=10)] != []
    assert {h.id for h in fresh.query("apple", k=10)} == {f"a{i}" for i in range(5)}
    assert fresh.get(["a0"])[0].text == "apple number0"
    assert all(d.exists() for d in leftovers)  # readers never delete anything

    # The next writer removes them, and its own segment takes the leftover's id cleanly.
    eng.close()
    fresh = polyindex.open(tmp_path / "D").collection("c")
    fresh.add([{"_id": "b", "text": "banana"}, {"_id": "a1", "text": "apricot"}])
    assert not any(d.exists() for d in leftovers if d.name != f"seg-{nxt:06d}")
    manifest = load_manifest(folder)
    assert sorted(p.name for p in segs.iterdir()) == sorted(s.id for s in manifest.segments)
    assert manifest.segments[-1].id == f"seg-{nxt:06d}"
    table = pa.ipc.open_file(pa.memory_map(str(segs / f"seg-{nxt:06d}" / "docs.arrow"))).read_all()
    assert sorted(table.column("id").to_pylist()) == ["a1", "b"]
    again = polyindex.open(tmp_path / "D", readonly=True).collection("c")
    assert again.count() == 6
    assert again.get(["a1", "b"])[0].text == "apricot"
    assert {h.id for h in again.query("apple", k=10)} == {"a0", "a2", "a3", "a4"}


def test_interrupted_create_leftovers_are_not_collections(tmp_path, corpus, cli):
    """A kill inside create_collection leaves .c.creating (maybe with a manifest) or a bare c/."""
    data = tmp_path / "D"
    eng = polyindex.open(data)
    eng.create_collection("c", ["lexical"])
    eng.close()
    shutil.move(str(data / "c"), str(data / ".c.creating"))  # killed before the rename
    (data / "c").mkdir()  # and a bare folder without a manifest
    (data / "c" / "segments").mkdir()
    eng = polyindex.open(data)
    assert eng.list_collections() == []
    with pytest.raises(polyindex.NotFound):
        eng.collection("c")
    eng.close()  # the CLI is the next writer
    records = corpus.make(tmp_path / "corpus.jsonl", 300, seed=7)
    res = cli(*index_args(tmp_path / "corpus.jsonl", data, *LEXICAL, "--json"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["documents"] == len({r["_id"] for r in records})
    assert polyindex.open(data, readonly=True).list_collections() == ["c"]
    assert not (data / ".c.creating").exists()
    assert polyindex.open(data, readonly=True).collection("c").count() == \
        len({r["_id"] for r in records})
