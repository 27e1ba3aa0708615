"""An embedded writer merges like the server (``online.merging`` over ``online=None``): a
collection written in many ``add()`` calls ends as few segments without ``compact()``,
answers the same meanwhile, closes with its merger stopped, and loses nothing acknowledged
when killed mid-merge. The suite runs with it off (conftest); these tests turn it on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import polyindex
from polyindex.storage.manifest import SegmentEntry
from polyindex.storage.merge_policy import TieredPolicy
from polyindex.storage.verify import verify_collection

WORDS = "river mountain ocean forest desert city harbor valley glacier canyon meadow".split()


def _entry(i: int, rows: int) -> SegmentEntry:
    return SegmentEntry(id=f"seg-{i:06d}", n_rows=rows, indexes={})


def docs(start: int, n: int, d: int = 8) -> list[dict]:
    """Documents d<start>.. with text and, when ``d``, a ``d``-dim vector."""
    rng = np.random.default_rng(start)
    return [{"id": f"d{i}", "text": f"w{i} " + " ".join(rng.choice(WORDS, 6)),
             **({"vector": rng.standard_normal(d).astype(np.float32)} if d else {})}
            for i in range(start, start + n)]


def wait_for(cond, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def merging(setting):
    setting("POLYINDEX_MERGE_EMBEDDED", "1")
    setting("POLYINDEX_MERGE_IDLE", "0.3")


def test_policy_below_the_floor():
    p = TieredPolicy(factor=4, floor_rows=20_000)
    three = [_entry(i, 100) for i in range(3)]
    assert p.plan(three) is None  # three of one size: not yet
    four = three + [_entry(3, 120)]
    assert p.plan(four) == [s.id for s in four]  # four of one power of 4: merged
    mixed = [_entry(0, 400), _entry(1, 100), _entry(2, 100), _entry(3, 100)]
    assert p.plan(mixed) is None  # 100s and a 400: different powers
    assert p.plan(mixed + [_entry(4, 90)]) == ["seg-000004", "seg-000001", "seg-000002",
                                               "seg-000003"]  # the smallest four of a power
    assert p.plan(mixed, idle=True) == ["seg-000001", "seg-000002", "seg-000003", "seg-000000"]
    assert p.plan([_entry(0, 500)], idle=True) is None  # one segment: nothing to merge
    big = [_entry(0, 50_000), _entry(1, 60_000)]
    assert p.plan(big + [_entry(2, 10)], idle=True) is None  # idle touches only tier 0


def test_many_adds_merge_without_compact(eng, merging):
    coll = eng.create_collection("c", ["lexical", "dense:Flat"], model=None)
    assert eng.collection("c").live.merger is not None
    for b in range(40):
        coll.add(docs(b * 10, 10))
    q = np.random.default_rng(9).standard_normal(8).astype(np.float32)
    before_lex = [(h.id, h.score) for h in coll.query("river w7", k=20, profile="lexical")]
    before_dense = [(h.id, h.score) for h in coll.query(vector=q, k=20, profile="dense")]
    # quiet now: the smallest tier becomes one segment, no compact() called
    assert wait_for(lambda: coll.info()["segments"] == 1), coll.info()["segments"]
    assert coll.count() == 400
    assert coll.info()["merges"] >= 1
    assert [(h.id, h.score) for h in coll.query("river w7", k=20, profile="lexical")] == \
        before_lex
    assert [(h.id, h.score) for h in coll.query(vector=q, k=20, profile="dense")] == \
        before_dense
    assert all(d is not None for d in coll.get([f"d{i}" for i in range(400)]))


def test_segments_stay_few_while_written(eng, merging, setting):
    setting("POLYINDEX_MERGE_IDLE", "3600")  # never quiet: only the log rule below the floor
    coll = eng.create_collection("c", ["lexical"], model=None)
    for b in range(64):
        coll.add(docs(b * 5, 5, d=0))
    # 64 segments of 5 rows merge 4 at a time into 20s, 80s, 320: a handful, never 64
    assert wait_for(lambda: coll.info()["segments"] <= 12), coll.info()["segments"]
    assert coll.count() == 320


def test_off_keeps_segmentation(eng, setting):
    setting("POLYINDEX_MERGE_EMBEDDED", "0")
    coll = eng.create_collection("c", ["lexical"], model=None)
    assert coll.live.merger is None
    for b in range(6):
        coll.add(docs(b * 5, 5, d=0))
    time.sleep(0.5)
    assert coll.info()["segments"] == 6


def test_close_stops_the_merger(tmp_path, merging, setting):
    eng = polyindex.open(tmp_path / "data")
    coll = eng.create_collection("c", ["lexical", "dense:Flat"], model=None)
    for b in range(4):  # four of one size: a merge at once, built in the build process
        coll.add(docs(b * 3000, 3000))
    merger = coll.live.merger
    assert wait_for(lambda: any((tmp_path / "data/c/segments").glob(".merge-*"))
                    or coll.info()["segments"] == 1, 60)
    t0 = time.monotonic()
    eng.close()  # the build in flight is stopped (its process killed), nothing committed
    assert time.monotonic() - t0 < 20 and not merger._thread.is_alive()
    setting("POLYINDEX_MERGE_EMBEDDED", "0")  # reopened without a merge of its own
    with polyindex.open(tmp_path / "data") as e2:
        c2 = e2.collection("c")
        assert c2.count() == 12_000 and 1 <= c2.info()["segments"] <= 4
        assert not list((tmp_path / "data/c/segments").glob(".merge-*"))  # swept at open


CHILD = r"""
import json, sys
import numpy as np
import polyindex
sys.path.insert(0, sys.argv[2])
from test_embedded_merge import docs
eng = polyindex.open(sys.argv[1])
coll = eng.create_collection("c", ["lexical", "dense:Flat"], model=None)
b = 0
while True:
    coll.add(docs(b * 10, 10))
    print(json.dumps([b * 10, b * 10 + 10]), flush=True)  # acknowledged: add() returned
    b += 1
"""


@pytest.mark.slow  # a writer process started and killed: seconds each on a busy machine
@pytest.mark.parametrize("how", ["kill -9 during the build", "crash at the manifest commit"])
def test_kill_during_an_embedded_merge_loses_nothing(tmp_path, how):
    data = tmp_path / "data"
    env = {**os.environ, "POLYINDEX_MERGE_EMBEDDED": "1", "POLYINDEX_MERGE_IDLE": "0",
           "POLYINDEX_FAILPOINTS": "merge.segment.write=hang" if how.startswith("kill")
           else "merge.manifest.rename=crash"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(data), str(Path(__file__).parent)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    acked: list[int] = []
    merging_seen = crashed = False
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                crashed = True  # the crash failpoint killed it
                break
            lo, hi = json.loads(line)
            acked.extend(range(lo, hi))
            tmp = list((data / "c/segments").glob(".merge-*")) if (data / "c").exists() else []
            if tmp and len(acked) >= 60 and how.startswith("kill"):
                merging_seen = True  # a merge is being built, and writes went on beside it
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None and not merging_seen:
            proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    assert merging_seen if how.startswith("kill") else crashed  # not the deadline's kill
    assert acked
    with polyindex.open(data) as eng:  # the suite's default: no merging on reopen
        coll = eng.collection("c")
        got = coll.get([f"d{i}" for i in acked])
        assert all(d is not None for d in got), [i for i, d in zip(acked, got) if d is None][:5]
        assert coll.count() >= len(acked)
        assert {h.id for h in coll.query(f"w{acked[-1]}", k=3, profile="lexical")} >= \
            {f"d{acked[-1]}"}
    assert verify_collection(data / "c").ok  # every file the manifest names is whole


def test_size_of_a_folder_removed_while_counted(tmp_path, monkeypatch):
    """``info()`` beside a merge's garbage collection: a folder that vanishes while its
    bytes are counted counts 0 (it raised FileNotFoundError)."""
    from polyindex.storage import gc
    (tmp_path / "seg").mkdir()
    (tmp_path / "seg" / "a").write_bytes(b"x" * 10)
    assert gc.size_of(tmp_path / "seg") == 10

    def gone(self):
        raise FileNotFoundError(self)
    monkeypatch.setattr(Path, "iterdir", gone)
    assert gc.size_of(tmp_path / "seg") == 0
