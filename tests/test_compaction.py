"""Compaction: merges equal a fresh index of the same live rows, lose nothing under faults or
crashes at any step, leave no garbage, never delete what a live snapshot reads, and run in
the background of an online collection while it is written."""
from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

import merge_workload as mw
import numpy as np
import pytest
from conftest import run_each

import polyindex
from polyindex.storage import failpoints
from polyindex.storage.manifest import SegmentEntry
from polyindex.storage.merge_policy import TieredPolicy, compact_plan

HERE = Path(__file__).parent
WORDS = ("river ocean forest desert city harbor valley glacier canyon meadow island prairie "
         "volcano tundra lagoon marsh plateau flutter wing shock boundary layer").split()


def _doc(i: int, rng, tag: str = "") -> dict:
    img = rng.standard_normal(6).astype(np.float32)
    return {"id": f"d{i}", "title": f"t{i}{tag}",
            "text": " ".join(rng.choice(WORDS, 14)) + f" v{i}{tag}", "vectors": {"img": img.tolist()}}


def _top(coll, queries, profile, k=10):
    out = []
    for q in queries:
        hits = coll.query(q, k=k, profile=profile) if isinstance(q, str) else \
            coll.query(vector=q, using="img", k=k)
        out.append([(h.id, h.score) for h in hits])
    return out


def _same(a, b, tol=1e-5):
    for x, y in zip(a, b):
        assert [i for i, _ in x] == [i for i, _ in y]
        np.testing.assert_allclose([s for _, s in x], [s for _, s in y], rtol=tol, atol=tol)


def test_a_merge_equals_a_fresh_index_of_the_same_live_rows(tmp_path):
    """lexical, dense (model), tree and a user vector field: the compacted collection answers
    exactly as one built fresh from its live rows in the same order."""
    rng = np.random.default_rng(3)
    kinds = ["lexical", "dense", "tree:branch=4,leaf=8", "dense@img:dim=6,metric=cosine,Flat"]
    # float32: a text's bf16 embedding depends on the batch it was encoded in (the fresh
    # collection encodes all at once), by up to ~5e-4 in a score on this CPU
    with polyindex.open(tmp_path / "a") as eng:
        coll = eng.create_collection("c", kinds, dtype="float32")
        for b in range(5):
            coll.add([_doc(i, rng) for i in range(b * 30, b * 30 + 30)])
            coll.add([_doc(i, rng, f"r{b}") for i in range(b, 150, 17)])  # replacements
        coll.delete([f"d{i}" for i in range(0, 150, 11)])
        assert coll.info()["segments"] == 10
        report = coll.compact(max_segments=1)
        assert report["after"]["segments"] == 1 and report["after"]["deleted_rows"] == 0
        snap = coll.view()
        order = snap.segments[0].docs.ids.tolist()
        docs = {d.id: d for d in coll.get(order, with_vectors=True)}
        queries = ["river ocean", "wing flutter shock", "v77 city", "glacier"]
        vq = [rng.standard_normal(6).astype(np.float32) for _ in range(3)]
        merged = {p: _top(coll, queries, p) for p in ("lexical", "dense", "tree", "hybrid")}
        merged["img"] = _top(coll, vq, None)
    with polyindex.open(tmp_path / "b") as eng:
        fresh = eng.create_collection("c", kinds, dtype="float32")
        fresh.add([{"id": d.id, "title": d.title, "text": d.text,
                    "vectors": {"img": d.vectors["img"].tolist()}} for d in docs.values()])
        assert fresh.count() == len(order) == 150 - len(range(0, 150, 11))
        for p in ("lexical", "dense", "tree", "hybrid"):
            _same(merged[p], _top(fresh, queries, p))
        _same(merged["img"], _top(fresh, vq, None))


def test_trained_kinds_keep_their_codes_through_a_merge(tmp_path):
    """sparse and multivector (collection-level training): scores before and after merging
    are equal; multivector's stored token codes are copied, not re-encoded."""
    rng = np.random.default_rng(5)
    kinds = ["lexical", "sparse:UHD4096,k=32", "multivector:KMeans32,residual=PQ8"]
    queries = ["river ocean", "wing flutter shock", "glacier canyon"]
    with polyindex.open(tmp_path) as eng:
        coll = eng.create_collection("c", kinds)
        for b in range(4):
            coll.add([{k: v for k, v in _doc(i, rng).items() if k != "vectors"}
                      for i in range(b * 25, b * 25 + 25)])
        coll.delete(["d3", "d40", "d77"])
        before = {p: _top(coll, queries, p) for p in ("sparse", "multivector")}
        tokens_before = sum(s.indexes["multivector"]["tokens_stored"]
                            for s in coll.view().manifest.segments)
        coll.compact(max_segments=1)
        (entry,) = coll.view().manifest.segments
        assert entry.indexes["multivector"]["salience"] == "merged"
        assert entry.indexes["multivector"]["tokens_stored"] < tokens_before  # 3 docs fewer
        for p in ("sparse", "multivector"):
            _same(before[p], _top(coll, queries, p))


def test_compaction_reclaims_deleted_rows_and_leaves_no_garbage(tmp_path):
    live = mw.setup(tmp_path)
    folder = tmp_path / "m"
    with polyindex.open(tmp_path) as eng:
        coll = eng.collection("m")
        info = coll.info()
        assert info["segments"] == 10 and info["deleted_rows"] > 0
        assert info["bytes_reclaimable"] > 0
        report = coll.compact()
        assert report["after"]["deleted_rows"] == 0
        assert report["after"]["segments"] == 1  # one size tier: one segment
        assert report["after"]["bytes_on_disk"] < report["before"]["bytes_on_disk"]
        assert report["after"]["bytes_reclaimable"] == 0
    assert [p.name for p in (folder / "segments").iterdir()] == \
        [report["merges"][-1]["segment"]]
    assert list((folder / "tombstones").iterdir()) == []
    mw.check(tmp_path, live)


def test_old_tombstone_versions_are_collected_after_deletes(tmp_path):
    with polyindex.open(tmp_path) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add([{"id": f"d{i}", "text": f"word{i}"} for i in range(50)])
        for i in range(5):
            coll.delete([f"d{i}"])
        files = sorted(p.name for p in (tmp_path / "c" / "tombstones").iterdir())
        assert files == [coll.view().manifest.segments[0].tombstones.split("/")[1]]
        assert coll.count() == 45


def test_gc_never_deletes_what_a_live_snapshot_reads(tmp_path):
    live = mw.setup(tmp_path)
    folder = tmp_path / "m"
    with polyindex.open(tmp_path) as eng:
        coll = eng.collection("m")
        old = coll.view()
        old_folders = [s.docs.folder for s in old.segments]
        old_tombs = [folder / e.tombstones for e in old.manifest.segments if e.tombstones]
        coll.compact(max_segments=1)
        assert len(coll.view().segments) == 1
        # the old snapshot still answers from its own files, all still there
        assert all(f.is_dir() for f in old_folders) and all(t.is_file() for t in old_tombs)
        assert old.count() == len(live)
        assert sorted(old.ids_of(np.flatnonzero(np.concatenate(
            [np.ones(s.docs.n_rows, bool) if m is None else m
             for s, m in zip(old.segments, old.live)])))) == sorted(live)
        del old
        import gc as pygc
        pygc.collect()
        coll.add([{"id": "new", "text": "fresh common", "vector": mw.vec(999)}])  # next commit collects
        assert not any(f.exists() for f in old_folders)
        assert not any(t.exists() for t in old_tombs)
    live["new"] = ("fresh common", mw.vec(999))
    mw.check(tmp_path, live)


def test_rows_deleted_or_replaced_during_a_merge_stay_deleted(tmp_path):
    live = mw.setup(tmp_path)
    with polyindex.open(tmp_path) as eng:
        coll = eng.collection("m")
        ids = [s.id for s in coll.view().manifest.segments]
        done = []

        def meanwhile():  # called by the merge between its kinds' builds: writes go on
            if not done:
                done.append(1)
                coll.delete(["d1", "d50"])
                coll.add([{"id": "d2", "text": "replaced meanwhile common", "vector": mw.vec(2, 99)}])
            return False
        report = coll.merge(ids, stop=meanwhile)
        assert report is not None and done
        segs = coll.view().manifest.segments
        assert segs[0].n_deleted == 3  # d1, d50 and the old d2, tombstoned in the new segment
    for i in ("d1", "d50"):
        live.pop(i, None)
    live["d2"] = ("replaced meanwhile common", mw.vec(2, 99))
    mw.check(tmp_path, live)


MERGE_POINTS = ["merge.segment.write", "merge.segment.fsync", "merge.segment.fsync_dir",
                "merge.segment.rename", "merge.manifest.write", "merge.manifest.fsync",
                "merge.manifest.rename", "merge.manifest.fsync_dir", "gc.unlink", "gc.fsync_dir"]


def test_the_compaction_workload_reaches_every_merge_point(tmp_path):
    mw.setup(tmp_path)
    with failpoints.record() as log, polyindex.open(tmp_path) as eng:
        eng.collection("m").compact()
    seen = {p for p, _ in log}
    assert set(MERGE_POINTS) <= seen, sorted(set(MERGE_POINTS) - seen)


@pytest.mark.parametrize("point", MERGE_POINTS + ["merge.tombstones.write",
                                                  "merge.tombstones.fsync_dir"])
def test_an_error_at_a_merge_step_loses_nothing(tmp_path, point):
    live = mw.setup(tmp_path)
    injected = 0
    with polyindex.open(tmp_path) as eng:
        coll = eng.collection("m")
        ids = [s.id for s in coll.view().manifest.segments]

        def meanwhile():  # a delete during the merge, so it has tombstones to write
            if "d5" in live:
                coll.delete(["d5"])
                live.pop("d5")
            return False
        with failpoints.armed(point, "enospc" if "write" in point else "error"):
            try:
                coll.merge(ids, stop=meanwhile)
            except OSError:
                pass
            injected = failpoints.fired(point)
        assert injected == 1, point
    mw.check(tmp_path, live)
    with polyindex.open(tmp_path) as eng:  # and the next compaction completes
        eng.collection("m").compact()
    mw.check(tmp_path, live)
    assert mw.leftovers(tmp_path) == []


def test_a_crash_at_every_merge_step_loses_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    crashed = Counter()
    # one write and one rename per merge: no second hit of those
    crashes = [(p, n) for p in MERGE_POINTS for n in (1, 2)
               if not (p.startswith("merge.segment") and n == 2 and "fsync" not in p)]
    runs = run_each([([sys.executable, str(HERE / "merge_workload.py"), str(tmp_path / f"{p}@{n}"),
                       f"{p}@{n}"], env) for p, n in crashes])
    for (point, nth), run in zip(crashes, runs):
        path = tmp_path / f"{point}@{nth}"
        assert "setup done" in run.stdout, run.stderr[-2000:]
        live = json.loads((tmp_path / f"{point}@{nth}.live.json").read_text())
        if run.returncode == 0:
            continue  # the point was not hit that often
        assert run.returncode == -9, (point, nth, run.returncode, run.stderr[-2000:])
        crashed[point] += 1
        mw.check(path, live)
        with polyindex.open(path) as eng:  # a writer sweeps what the crash left
            coll = eng.collection("m")
            coll.add([{"id": "after", "text": "after crash common", "vector": mw.vec(1000)}])
        assert mw.leftovers(path) == [], (point, nth)
        live["after"] = ["after crash common", mw.vec(1000)]
        mw.check(path, live)
    print("\ncrashes per merge point:", json.dumps(dict(crashed), indent=1))
    assert set(crashed) == set(MERGE_POINTS)


def test_online_collection_merges_in_the_background_while_written(tmp_path, monkeypatch,
                                                                  setting):
    setting("POLYINDEX_MERGE_FACTOR", "3")
    setting("POLYINDEX_MERGE_IDLE", "3600")  # merges while written, not one once quiet
    monkeypatch.setattr("polyindex.online.merging.INTERVAL_S", 0.2)
    expected: dict[str, str] = {}
    with polyindex.open(tmp_path, online=True) as eng:
        coll = eng.create_collection("o", ["lexical"], model=None)
        stop = threading.Event()
        errors = []

        def reader():
            while not stop.is_set():
                try:
                    n = len(coll.query("common", k=1000, profile="lexical"))
                    assert n <= 1000
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)
        t = threading.Thread(target=reader)
        t.start()
        for b in range(24):
            docs = [{"id": f"d{(b * 7 + j) % 120}", "text": f"common b{b} j{j}"} for j in range(10)]
            coll.add(docs)
            expected.update({d["id"]: d["text"] for d in docs})
            if b % 5 == 4:
                coll.delete([f"d{b}"])
                expected.pop(f"d{b}", None)
            coll.seal()
        stop.set()
        t.join()
        assert not errors, errors[:3]
        import time
        deadline = time.monotonic() + 30
        info = coll.info()
        while (info["merges"] < 3 or info["segments"] >= 12) and time.monotonic() < deadline:
            time.sleep(0.1)
            info = coll.info()
        assert info["merges"] >= 3 and info["merge_failures"] == 0
        assert info["segments"] < 12
        got = coll.get(sorted(expected))
        assert [d.text for d in got] == [expected[i] for i in sorted(expected)]
        assert coll.count() == len(expected)
    with polyindex.open(tmp_path, readonly=True) as eng:
        coll = eng.collection("o")
        assert coll.count() == len(expected)
        assert [d.text for d in coll.get(sorted(expected))] == [expected[i] for i in sorted(expected)]


def test_a_reader_in_another_handle_follows_merges(tmp_path):
    live = mw.setup(tmp_path)
    reader = polyindex.open(tmp_path, readonly=True).collection("m")
    assert reader.count() == len(live)
    with polyindex.open(tmp_path) as eng:
        eng.collection("m").compact(max_segments=2)
    import time
    time.sleep(0.1)  # past the reader's manifest re-check interval
    assert reader.count() == len(live)
    assert len(reader.view().segments) == 2
    assert sorted(h.id for h in reader.query("common", k=500, profile="lexical")) == sorted(live)


def _entry(i: int, rows: int, deleted: int = 0) -> SegmentEntry:
    return SegmentEntry(f"seg-{i:06d}", rows, {}, n_deleted=deleted)


def test_tiered_policy_plans():
    p = TieredPolicy(factor=4, floor_rows=100, max_rows=10_000, deletes_pct=0.5)
    assert p.plan([_entry(0, 40), _entry(1, 50)]) is None  # tier 0 under the floor together
    small = [_entry(i, 40) for i in range(3)]
    assert p.plan(small) == [s.id for s in small]  # 120 rows >= the floor: merged at once
    # a higher tier needs `factor` segments, and tiers are separate
    big = [_entry(i, 300) for i in range(4, 7)]
    assert p.plan(big + [_entry(9, 50)]) is None
    assert p.plan(big + [_entry(7, 250)]) == ["seg-000007"] + [s.id for s in big]
    assert p.plan([_entry(0, 1000, deleted=600)]) == ["seg-000000"]
    assert p.plan([_entry(i, 9_000) for i in range(4)]) is None  # would pass max_rows
    # compaction: to at most N, smallest first; then every segment with deletes
    segs = [_entry(0, 5000), _entry(1, 10), _entry(2, 20, deleted=1), _entry(3, 30)]
    assert compact_plan(segs, p, 2) == ["seg-000001", "seg-000002", "seg-000003"]
    assert compact_plan(segs, p, None) == ["seg-000001", "seg-000002", "seg-000003"]
    # ... but never past max_rows: the smallest that fit, or (none fit) on to the deletes
    assert compact_plan([_entry(0, 6000), _entry(1, 3000), _entry(2, 2000)], p, 1) == \
        ["seg-000002", "seg-000001"]
    assert compact_plan([_entry(0, 6000), _entry(1, 5000, deleted=3)], p, 1) == ["seg-000001"]
    assert compact_plan([_entry(0, 6000), _entry(1, 5000)], p, 1) is None
    # a lone segment under the floor is folded into the smallest other one
    assert compact_plan([_entry(0, 5000), _entry(1, 10, deleted=2)], p, None) == \
        ["seg-000001", "seg-000000"]
    assert compact_plan([_entry(0, 5000), _entry(1, 10), _entry(2, 900)], p, None) == \
        ["seg-000001", "seg-000002"]
    assert compact_plan([_entry(0, 9_995), _entry(1, 10)], p, None) is None  # past max_rows
    assert compact_plan([_entry(1, 10, deleted=2)], p, None) == ["seg-000001"]
    assert compact_plan([_entry(0, 5000)], p, None) is None


def test_the_compact_command(tmp_path, cli):
    live = mw.setup(tmp_path)
    run = cli("compact", "--data", tmp_path, "--collection", "m", "--max-segments", "2", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["before"]["segments"] == 10 and report["after"]["segments"] == 2
    assert report["after"]["deleted_rows"] == 0 and report["merges"]
    mw.check(tmp_path, live)
    table = cli("compact", "--data", tmp_path, "--collection", "m")
    assert table.returncode == 0 and "before" in table.stdout and "after" in table.stdout
    with polyindex.open(tmp_path):  # a writer holds the directory: refused, saying so
        busy = cli("compact", "--data", tmp_path, "--collection", "m")
    assert busy.returncode == 1 and "already open for writing" in busy.stderr
    missing = cli("compact", "--data", tmp_path, "--collection", "nope")
    assert missing.returncode == 2 and "nope" in missing.stderr  # a user error: NOT_FOUND


def test_lexical_merges_its_postings_without_analyzing_again(tmp_path, monkeypatch):
    import pyarrow as pa
    from polyindex.index.lexical import kind as lexical
    rng = np.random.default_rng(9)
    with polyindex.open(tmp_path / "a") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        for b in range(4):
            coll.add([{"id": f"d{i}", "title": f"Title {i % 7}", "text": " ".join(
                rng.choice(WORDS, 10)) + f" only{i}"} for i in range(b * 40, b * 40 + 40)])
        coll.delete([f"d{i}" for i in range(0, 160, 9)])

        def no_analysis(*a, **k):
            raise AssertionError("a merge analyzed text")
        with monkeypatch.context() as m:
            m.setattr(lexical.Analyzer, "analyze_many", no_analysis)
            m.setattr(lexical.Analyzer, "analyze_columns", no_analysis)
            coll.compact(max_segments=1)
        (seg,) = coll.view().segments
        order = seg.docs.ids.tolist()
        docs = coll.get(order)
        merged = seg.docs.folder
    with polyindex.open(tmp_path / "b") as eng:
        fresh = eng.create_collection("c", ["lexical"], model=None)
        fresh.add([{"id": d.id, "title": d.title, "text": d.text} for d in docs])
        built = fresh.view().segments[0].docs.folder
        for name in ("lexical.vocab.arrow", "lexical.postings.arrow", "lexical.doclen.arrow",
                     "lexical.forward.arrow", "lexical.blocks.arrow", "lexical.wide.arrow"):
            a = pa.ipc.open_file(pa.memory_map(str(merged / name))).read_all()
            b = pa.ipc.open_file(pa.memory_map(str(built / name))).read_all()
            assert a.equals(b), name
