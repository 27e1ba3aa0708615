"""The failpoint campaign: an error, or a crash, injected at every write, fsync, rename and
unlink (and, for followers, every read) of the durable paths, each followed by a reopen that
must show exactly the acknowledged operations and verify.

Families (each a workload whose clean run is recorded first; the faults are planned from
its hits, so the count is fixed, not a matter of timing):

- ``online``: WAL append, rotation and drop, seals (segment, tombstones, manifest commit),
  collection create and drop (``fault_workload``), errors in-process and crashes (SIGKILL
  at the point) in a subprocess;
- ``gc``: the removals of what merges replaced (``gc.*``; fail: left for the next sweep);
- ``bulk``: ``Collection.index`` committing segment by segment (``bulk_workload``); a
  failed or killed run leaves whole segments and the rerun resumes;
- ``merge``: a merge with a delete during its build (its own tombstones), then ``compact``
  (``merge_workload``), and the background merger of an online collection, which logs,
  backs off and retries;
- ``follower``: a read-only follower's WAL tail, manifest re-read and segment opens
  (``follow_workload``): a failed query, then a retry that answers the acknowledged state.

The workloads seal only when told (no size or age seals) and run with background merging
off (but for the merger's own test), which makes every run reach the same hits: every
planned fault must fire. ``-s`` prints the counts; at least ``FLOOR`` in all.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import bulk_workload as bw
import fault_workload as wl
import follow_workload as fw
import merge_workload as mw
import pytest
from conftest import run_each

import polyindex
from polyindex.storage import failpoints

HERE = Path(__file__).parent
# The whole campaign is the slow tier (about 3 minutes, many subprocesses): `make test` runs it,
# `make test-fast` leaves it out.
pytestmark = pytest.mark.slow
FLOOR = 200
ERRORS_PER_POINT = 14  # the first N hits of each point get an error injected
CRASHES_PER_POINT = 2  # and the first N hits, a crash
BULK_PER_POINT = 5
BULK_CRASHES_PER_POINT = 1
MERGE_PER_POINT = 3
FOLLOW_PER_POINT = 6
ONLINE = ("commit.", "wal.append.", "wal.rotate.", "wal.drop.", "drop.", "create.", "gc.")
MERGE = ("merge.", "gc.")
FOLLOW = ("follow.",)
# The background merger's steps injected once each (it retries after its backoff)
MERGER_POINTS = ("merge.segment.write", "merge.segment.fsync", "merge.segment.rename",
                 "merge.manifest.write", "merge.manifest.rename", "merge.manifest.fsync_dir")


# Every fault injected and checked, as (family, point, nth, how): measured, and
# compared with the plan by the last test of this file.
INJECTED: set[tuple[str, str, int, str]] = set()


def family(point: str, default: str) -> str:
    return "gc" if point.startswith("gc.") else default


def action(nth: int) -> str:
    return "enospc" if nth % 2 else "error"


def reached(run, prefixes) -> Counter:
    """The hits of the points named by ``prefixes`` in one recorded run of ``run()``."""
    with failpoints.record() as log:
        run()
    return Counter(p for p, _ in log if p.startswith(prefixes))


def plan(hits: Counter, per_point: int) -> list[tuple[str, int]]:
    return [(p, nth) for p, n in sorted(hits.items()) for nth in range(1, min(n, per_point) + 1)]


def same_twice(make, prefixes) -> Counter:
    """The hits of two clean runs, which must be the same: a fault planned from them fires.
    ``make(i)`` gives the run and the check of its result (not recorded)."""
    got = []
    for i in range(2):
        run, check = make(i)
        got.append(reached(run, prefixes))
        check()
    first, second = got
    assert first == second, {p: (first[p], second[p]) for p in first | second
                             if first[p] != second[p]}
    return first


@pytest.fixture(scope="module", autouse=True)
def quiet_writers():
    """No background merging (its timing would move the workloads' hits) and no follower
    rate limit (every follower query catches up once)."""
    from polyindex.config import reload_settings
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLYINDEX_MERGE", "0")
        reload_settings()  # settings are read once a process: again, with the line above
        mp.setattr("polyindex.online.follow.RECHECK_S", 0.0)
        yield
    reload_settings()


# -- the plans: clean runs, recorded ---------------------------------------------------------

@pytest.fixture(scope="module")
def online_hits(tmp_path_factory) -> Counter:
    def make(i):
        path, acked = tmp_path_factory.mktemp(f"online{i}"), []
        return lambda: wl.run(path, acked.append), lambda: wl.check(path, acked)
    return same_twice(make, ONLINE)


@pytest.fixture(scope="module")
def bulk_hits(tmp_path_factory) -> Counter:
    def make(i):
        path = tmp_path_factory.mktemp(f"bulk{i}")
        src = bw.source(path)
        bw.create(path / "data")
        return (lambda: bw.index(path / "data", src),
                lambda: bw.check(path / "data", src, complete=True))
    return same_twice(make, ("commit.",))


@pytest.fixture(scope="module")
def merge_setup(tmp_path_factory) -> tuple[Path, dict]:
    """A collection of many small segments with deleted and replaced rows, copied per run."""
    path = tmp_path_factory.mktemp("merge-setup") / "data"
    return path, mw.setup(path)


@pytest.fixture(scope="module")
def merge_hits(merge_setup, tmp_path_factory) -> Counter:
    def make(i):
        path = tmp_path_factory.mktemp(f"merge{i}") / "data"
        shutil.copytree(merge_setup[0], path)
        gone = set()
        return lambda: _compact(path, gone), lambda: mw.check(path, _live(merge_setup[1], gone))
    return same_twice(make, MERGE)


@pytest.fixture(scope="module")
def follow_hits(tmp_path_factory) -> Counter:
    def make(i):
        path = tmp_path_factory.mktemp(f"follow{i}")
        return lambda: fw.run(path, []), lambda: None  # the run checks every round
    return same_twice(make, FOLLOW)


def _compact(path: Path, gone: set) -> None:
    """One merge of the four oldest segments with a delete during its build (so it has
    tombstones of its own to write), then ``compact``; ``gone``: what was deleted."""
    with polyindex.open(path) as eng:
        coll = eng.collection("m")

        def meanwhile():  # d1: a row of the first segment
            if "d1" not in gone:
                coll.delete(["d1"])
                gone.add("d1")
            return False
        coll.merge([s.id for s in coll.view().manifest.segments][:4], stop=meanwhile)
        coll.compact()


def _live(live: dict, gone: set) -> dict:
    return {i: v for i, v in live.items() if i not in gone}


# -- the floor ---------------------------------------------------------------------------------

def planned(online_hits, bulk_hits, merge_hits, follow_hits) -> Counter:
    out = Counter()
    for point, _ in plan(online_hits, ERRORS_PER_POINT) + plan(online_hits, CRASHES_PER_POINT):
        out[family(point, "online")] += 1
    out["bulk"] += len(plan(bulk_hits, BULK_PER_POINT) + plan(bulk_hits, BULK_CRASHES_PER_POINT))
    for point, _ in plan(merge_hits, MERGE_PER_POINT):
        out[family(point, "merge")] += 1
    out["merge"] += len(MERGER_POINTS)
    out["follower"] += len(plan(follow_hits, FOLLOW_PER_POINT))
    return out


def test_the_workloads_reach_every_path_and_plan_the_floor(online_hits, bulk_hits, merge_hits,
                                                           follow_hits):
    """Every planned fault is asserted to fire by its family's test below."""
    for prefix in ("commit.segment.", "commit.manifest.", "commit.tombstones.", "wal.append.",
                   "wal.rotate.", "wal.drop.", "drop.", "create."):
        assert any(p.startswith(prefix) for p in online_hits), (prefix, sorted(online_hits))
    assert any(p.startswith("commit.segment.") for p in bulk_hits), sorted(bulk_hits)
    for prefix in ("merge.segment.", "merge.tombstones.", "merge.manifest.", "gc.unlink",
                   "gc.fsync_dir"):
        assert any(p.startswith(prefix) for p in merge_hits), (prefix, sorted(merge_hits))
    for point in ("follow.wal.list", "follow.wal.open", "follow.wal.read",
                  "follow.manifest.read", "follow.segment.open", "follow.tombstones.read"):
        assert follow_hits[point] > 0, (point, sorted(follow_hits))
    counts = planned(online_hits, bulk_hits, merge_hits, follow_hits)
    print("\nfaults per family:", json.dumps(dict(counts)), "total", sum(counts.values()))
    assert all(counts[f] >= 5 for f in ("online", "gc", "bulk", "merge", "follower")), counts
    assert sum(counts.values()) >= FLOOR, counts


# -- online: WAL, seals, manifest, create and drop ---------------------------------------------

def test_an_error_at_every_point_loses_no_acknowledged_write(online_hits, tmp_path):
    injected = Counter()
    for point, nth in plan(online_hits, ERRORS_PER_POINT):
        path = tmp_path / f"{point}@{nth}"
        acked = []
        with failpoints.armed(point, action(nth), nth):
            wl.run(path, acked.append)
            fired = failpoints.fired(point)
        assert fired == 1, (point, nth)
        wl.check(path, acked)  # a failed operation had no effect at all
        injected[point] += 1
        INJECTED.add((family(point, "online"), point, nth, "error"))
    print("\nerrors injected per point:", json.dumps(dict(injected), indent=1))
    assert sum(injected.values()) == len(plan(online_hits, ERRORS_PER_POINT)) >= 150


def test_a_seal_under_way_is_not_due_again(tmp_path, monkeypatch):
    """The sealer thread took a seal in progress for a failed one and, once it was done,
    sealed the writes that came meanwhile: an unasked seal whose timing moved the hits of
    every later commit (why this campaign's floor had been lowered to what always fired)."""
    seen, hit = [], failpoints.hit
    with polyindex.open(tmp_path, online=True) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        online = coll.live.writes
        online.seal_docs, online.seal_seconds = 10**9, 1e9
        online._stop.set()  # no sealer thread: _due is asked here only
        online._thread.join()

        def spy(name, path=""):
            if name == "commit.manifest.write":  # the seal's commit is under way
                seen.append(online._due())
            return hit(name, path)
        monkeypatch.setattr("polyindex.storage.fsutil.hit", spy)
        coll.add([{"id": "a", "text": "alpha"}])
        coll.seal()
        assert seen == [False]
        coll.add([{"id": "b", "text": "alpha"}])
        with failpoints.armed("commit.manifest.rename", "error"), pytest.raises(OSError):
            coll.seal()
        assert seen == [False, False] and online.seal_failures == 1
        online._retry_at = 0.0
        assert online._due()  # a failed seal is retried


def test_a_crash_at_every_point_loses_no_acknowledged_write(online_hits, tmp_path):
    injected = Counter()
    env = {**os.environ, "PYTHONPATH": str(HERE), "POLYINDEX_MERGE": "0"}
    crashes = plan(online_hits, CRASHES_PER_POINT)
    runs = run_each([([sys.executable, str(HERE / "fault_workload.py"), str(tmp_path / f"{p}@{n}")],
                      {**env, "POLYINDEX_FAILPOINTS": f"{p}=crash@{n}"}) for p, n in crashes])
    for (point, nth), run in zip(crashes, runs):
        path = tmp_path / f"{point}@{nth}"
        assert run.returncode == -9, (point, nth, run.returncode, run.stderr[-2000:])
        acked = [tuple(json.loads(line)) for line in run.stdout.splitlines()]
        ops = list(wl.operations())
        in_flight = ops[len(acked)] if len(acked) < len(ops) else None
        wl.check(path, acked, in_flight)
        injected[point] += 1
        INJECTED.add((family(point, "online"), point, nth, "crash"))
    print("\ncrashes injected per point:", json.dumps(dict(injected), indent=1))
    assert sum(injected.values()) == len(plan(online_hits, CRASHES_PER_POINT)) >= 40


# -- bulk ingest ---------------------------------------------------------------------------------

def test_an_error_in_bulk_ingest_leaves_whole_segments_and_the_rerun_resumes(bulk_hits, tmp_path):
    src = bw.source(tmp_path)
    injected = 0
    for point, nth in plan(bulk_hits, BULK_PER_POINT):
        path = tmp_path / f"{point}@{nth}"
        bw.create(path)
        with failpoints.armed(point, action(nth), nth):
            with pytest.raises((OSError, polyindex.PolyindexError)):
                bw.index(path, src)
            assert failpoints.fired(point) == 1, (point, nth)
        bw.check(path, src, complete=False)  # whole segments, committed or not
        bw.index(path, src)  # resumes after the last committed segment
        assert bw.check(path, src, complete=True) == bw.DOCS
        assert mw.leftovers(path, "b") == [], (point, nth)
        injected += 1
        INJECTED.add(("bulk", point, nth, "error"))
    assert injected == len(plan(bulk_hits, BULK_PER_POINT))


def test_a_crash_in_bulk_ingest_leaves_whole_segments_and_the_rerun_resumes(bulk_hits, tmp_path):
    src = bw.source(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(HERE), "POLYINDEX_MERGE": "0"}
    injected = 0
    crashes = plan(bulk_hits, BULK_CRASHES_PER_POINT)
    for point, nth in crashes:
        bw.create(tmp_path / f"{point}@{nth}")
    runs = run_each([([sys.executable, str(HERE / "bulk_workload.py"), str(tmp_path / f"{p}@{n}"),
                       str(src)], {**env, "POLYINDEX_FAILPOINTS": f"{p}=crash@{n}"})
                     for p, n in crashes])
    for (point, nth), run in zip(crashes, runs):
        path = tmp_path / f"{point}@{nth}"
        assert run.returncode == -9, (point, nth, run.returncode, run.stderr[-2000:])
        bw.check(path, src, complete=False)  # whole segments (read-only: nothing swept yet)
        bw.index(path, src)  # a writer: sweeps what the crash left, resumes after the last commit
        assert bw.check(path, src, complete=True) == bw.DOCS
        assert mw.leftovers(path, "b") == [], (point, nth)
        injected += 1
        INJECTED.add(("bulk", point, nth, "crash"))
    assert injected == len(plan(bulk_hits, BULK_CRASHES_PER_POINT))


# -- merge (compact) and garbage collection -------------------------------------------------------

def test_an_error_at_every_compaction_and_gc_step_loses_nothing(merge_setup, merge_hits, tmp_path):
    setup, live = merge_setup
    injected = Counter()
    for point, nth in plan(merge_hits, MERGE_PER_POINT):
        path = tmp_path / f"{point}@{nth}"
        shutil.copytree(setup, path)
        gone = set()
        with failpoints.armed(point, action(nth), nth):
            if point.startswith("gc."):
                _compact(path, gone)  # a removal that fails is left for the next sweep
            else:
                with pytest.raises(OSError):
                    _compact(path, gone)
            assert failpoints.fired(point) == 1, (point, nth)
        # nothing lost, nothing deleted back, every file verifies
        mw.check(path, _live(live, gone))
        _compact(path, gone)  # the next compaction completes and removes every leftover
        mw.check(path, _live(live, gone))
        assert mw.leftovers(path) == [], (point, nth)
        injected[family(point, "merge")] += 1
        INJECTED.add((family(point, "merge"), point, nth, "error"))
    print("\ncompaction faults:", dict(injected))
    assert sum(injected.values()) == len(plan(merge_hits, MERGE_PER_POINT))


@pytest.mark.parametrize("point", MERGER_POINTS)
def test_the_background_merger_retries_a_failed_merge(point, tmp_path, monkeypatch, setting):
    setting("POLYINDEX_MERGE", "1")
    setting("POLYINDEX_MERGE_FACTOR", "3")
    monkeypatch.setattr("polyindex.online.merging.INTERVAL_S", 0.05)
    monkeypatch.setattr("polyindex.online.merging.BACKOFF_S", (0.05, 0.2))
    want: dict[str, str] = {}
    with polyindex.open(tmp_path, online=True) as eng:
        coll = eng.create_collection("o", ["lexical"], model=None)
        coll.live.writes.seal_docs, coll.live.writes.seal_seconds = 10**9, 1e9
        with failpoints.armed(point, "enospc" if "write" in point else "error"):
            for b in range(4):
                docs = [{"id": f"o{b}-{i}", "text": f"alpha b{b} {i}"} for i in range(4)]
                coll.add(docs)
                want.update({d["id"]: d["text"] for d in docs})
                if b == 2:
                    coll.delete(["o0-1"])
                    want.pop("o0-1")
                coll.seal()
            # failed once, then retried (an error after the manifest's rename: it was
            # committed, and the retry finds nothing left to merge)
            deadline = time.monotonic() + 60
            while len(coll.table.sealed_snapshot().manifest.segments) == 4 \
                    or not coll.table.merge_stats["merge_failures"]:
                assert time.monotonic() < deadline, coll.table.merge_stats
                time.sleep(0.02)
            assert failpoints.fired(point) == 1
        assert coll.table.merge_stats["merge_failures"] >= 1, coll.table.merge_stats
        assert f"failpoint {point}" in coll.table.merge_stats["last_merge_error"], coll.table.merge_stats
        assert fw.answer(coll) == want
    from polyindex.storage.verify import verify_data
    assert all(r.ok for r in verify_data(tmp_path, "o"))
    with polyindex.open(tmp_path, readonly=True) as eng:
        assert fw.answer(eng.collection("o")) == want
    INJECTED.add(("merge", point, 1, "error in the background merger"))


# -- the read-only follower ---------------------------------------------------------------------

def test_a_follower_survives_a_read_error_anywhere_and_catches_up(follow_hits, tmp_path):
    injected = Counter()
    for point, nth in plan(follow_hits, FOLLOW_PER_POINT):
        failures = []
        with failpoints.armed(point, action(nth), nth):
            rounds = fw.run(tmp_path / f"{point}@{nth}", failures)
            assert failpoints.fired(point) == 1, (point, nth)
        assert rounds == len(fw.ROUNDS)
        assert len(failures) == 1, (point, nth, failures)  # the query failed, not the view
        injected[point] += 1
        INJECTED.add(("follower", point, nth, "error"))
    print("\nfollower faults:", json.dumps(dict(injected), indent=1))
    assert sum(injected.values()) == len(plan(follow_hits, FOLLOW_PER_POINT))


def test_a_follower_read_error_between_two_log_files_loses_nothing(tmp_path):
    """A seal that failed keeps its log file and the writes after it go to the next: a
    follower reads both in one catch-up. An error opening the second used to leave the
    tail past the first file's records, which were lost to the view (then a hole in the
    sequence numbers, never published: the follower stayed stale until the next seal)."""
    with polyindex.open(tmp_path, online=True) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        online = coll.live.writes
        online.seal_docs, online.seal_seconds = 10**9, 1e9
        online._stop.set()  # no retried seal behind the test's back
        online._thread.join()
        with polyindex.open(tmp_path, readonly=True) as reader:
            follower = reader.collection("c")
            assert fw.answer(follower) == {}
            coll.add([{"id": "a", "text": "alpha one"}])
            with failpoints.armed("commit.manifest.rename", "error"), pytest.raises(OSError):
                coll.seal()
            coll.add([{"id": "b", "text": "alpha two"}])
            assert len(list((tmp_path / "c" / "wal").glob("wal-*.log"))) == 2
            with failpoints.armed("follow.wal.open", "error", nth=2):
                with pytest.raises(OSError):
                    fw.answer(follower)
                assert failpoints.fired("follow.wal.open") == 1
            assert fw.answer(follower) == {"a": "alpha one", "b": "alpha two"}


# -- the floor, measured -------------------------------------------------------------------------

CAMPAIGN = ("test_an_error_at_every_point_loses_no_acknowledged_write",
            "test_a_crash_at_every_point_loses_no_acknowledged_write",
            "test_an_error_in_bulk_ingest_leaves_whole_segments_and_the_rerun_resumes",
            "test_a_crash_in_bulk_ingest_leaves_whole_segments_and_the_rerun_resumes",
            "test_an_error_at_every_compaction_and_gc_step_loses_nothing",
            "test_the_background_merger_retries_a_failed_merge",
            "test_a_follower_survives_a_read_error_anywhere_and_catches_up")


def test_the_campaign_injected_at_least_the_floor(request, online_hits, bulk_hits, merge_hits,
                                                  follow_hits):
    """Last in the file: the faults the tests above injected and checked, counted."""
    ran = Counter(item.originalname for item in request.session.items
                  if item.module is request.module)
    if any(ran[name] == 0 for name in CAMPAIGN) \
            or ran["test_the_background_merger_retries_a_failed_merge"] != len(MERGER_POINTS):
        pytest.skip("the floor counts the whole campaign: run every test of this file")
    measured = Counter(f for f, *_ in INJECTED)
    print("\nfaults injected per family:", json.dumps(dict(measured)),
          "total", sum(measured.values()))
    assert measured == planned(online_hits, bulk_hits, merge_hits, follow_hits)
    assert all(measured[f] >= 5 for f in ("online", "gc", "bulk", "merge", "follower")), measured
    assert len(INJECTED) >= FLOOR, measured
