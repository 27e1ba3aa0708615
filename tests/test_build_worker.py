"""The build process (storage.build_worker): online seals and merges are built off the
serving process's GIL, with the same results; a dead or stopped build fails only its job."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import polyindex
from polyindex.errors import InvalidArgument
from polyindex.storage import build_worker


def _docs(n, seed, prefix="d"):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)]
    return [{"id": f"{prefix}{i}", "text": " ".join(rng.choice(words, 8)),
             "vector": rng.standard_normal(16).astype(np.float32)} for i in range(n)]


def _pids():
    return {k: (w._proc.pid if w._proc else None) for k, w in build_worker._workers.items()}


def test_jobs_run_in_another_process_and_errors_keep_their_type():
    w = build_worker.BuildWorker("test")
    try:
        pid = w.call("polyindex.storage.build_worker:pause", 0)
        assert pid != os.getpid()
        with pytest.raises(InvalidArgument, match="index kind"):
            w.call("polyindex.index.registry:from_factory", "nonsense-kind")
        with pytest.raises(ValueError, match="not a polyindex function"):
            w.call("os:getpid")
        assert w.call("polyindex.storage.build_worker:pause", 0) == pid  # same child kept
        with pytest.raises(Exception, match="pickle"):  # cut short mid-stream: child replaced
            w.call("polyindex.storage.build_worker:pause", lambda: 0)
        assert w.call("polyindex.storage.build_worker:pause", 0) != pid
    finally:
        w.close()


def test_a_killed_build_fails_its_job_and_the_next_job_gets_a_new_process():
    w = build_worker.BuildWorker("test")
    try:
        first = w.call("polyindex.storage.build_worker:pause", 0)
        got = {}

        def job():  # killed while it runs (an idle child found dead is simply replaced)
            try:
                got["result"] = w.call("polyindex.storage.build_worker:pause", 30)
            except build_worker.WorkerDied as e:
                got["result"] = e
        t = threading.Thread(target=job)
        t.start()
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        t.join(30)
        assert isinstance(got.get("result"), build_worker.WorkerDied), got
        second = w.call("polyindex.storage.build_worker:pause", 0)
        assert second != first
        t0 = time.monotonic()
        with pytest.raises(build_worker.Stopped):
            w.call("polyindex.storage.build_worker:pause", 30, stop=lambda: time.monotonic() - t0 > 0.3)
        assert time.monotonic() - t0 < 10
        _wait_gone(second)
    finally:
        w.close()


def _wait_gone(pid, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # a child of ours: reap it if it is a zombie
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs")


def test_the_build_process_exits_when_its_parent_dies_mid_job(tmp_path):
    script = textwrap.dedent("""
        import sys, threading
        from polyindex.storage import build_worker
        w = build_worker.worker("merge")
        w._ensure()
        print(w._proc.pid, flush=True)
        w.call("polyindex.storage.build_worker:pause", 60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the job is running
    parent.kill()
    parent.wait()
    _wait_gone(child)


def test_online_seals_and_merges_are_built_by_the_build_process_with_equal_results(tmp_path,
                                                                                   setting):
    setting("POLYINDEX_MERGE", "0")
    kinds = ["lexical", "dense:HNSW16,Flat"]
    batches = [_docs(150, s, prefix=f"b{s}-") for s in range(3)]
    results = {}
    for mode in ("1", "0"):
        setting("POLYINDEX_BUILD_WORKER", mode)
        with polyindex.open(tmp_path / mode, online=True) as eng:
            coll = eng.create_collection("c", kinds, model=None)
            for b in batches:
                coll.add(b)
                coll.seal()
            coll.delete(["b0-3", "b1-7"])
            coll.seal()
            if mode == "1":
                assert _pids().get("seal")  # the seals went through the build process
            coll.compact()
            if mode == "1":
                assert _pids().get("merge")
            info = coll.info()
            assert info["segments"] == 1 and info["merge_failures"] == 0
            q = batches[1][5]
            results[mode] = [[(h.id, round(h.score, 4)) for h in coll.query(
                q["text"], vector=q["vector"], k=10, profile=p)]
                for p in ("lexical", "dense", "hybrid")]
            assert coll.count() == 448
    assert results["1"] == results["0"]


def test_the_seal_at_close_builds_in_place_unless_the_build_process_is_up(tmp_path, setting,
                                                                          monkeypatch):
    setting("POLYINDEX_MERGE", "0")
    setting("POLYINDEX_BUILD_WORKER", "1")
    build_worker._close_all()  # no build process left by an earlier test
    sent = []
    call = build_worker.BuildWorker.call
    monkeypatch.setattr(build_worker.BuildWorker, "call",
                        lambda self, target, *a, **k: sent.append(target) or
                        call(self, target, *a, **k))
    first, second = ([{"id": d["id"], "text": d["text"]} for d in _docs(n, seed, prefix=p)]
                     for n, seed, p in ((40, 0, "a"), (30, 1, "b")))
    # never sealed before the close: built here, no build process started for it
    with polyindex.open(tmp_path / "cold", online=True) as eng:
        eng.create_collection("c", ["lexical"], model=None).add(first)
    assert sent == [] and not build_worker.running("seal")
    # the build process already up (an earlier seal): the close's seal goes through it
    with polyindex.open(tmp_path / "warm", online=True) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(first)
        coll.seal()
        assert len(sent) == 1 and build_worker.running("seal")
        coll.add(second)
    assert len(sent) == 2
    for name, n, segments in (("cold", 40, 1), ("warm", 70, 2)):  # sealed, not only logged
        with polyindex.open(tmp_path / name) as eng:
            coll = eng.collection("c")
            assert coll.count() == n and coll.info()["segments"] == segments
            assert "a3" in {h.id for h in coll.query(first[3]["text"], k=5, profile="lexical")}
