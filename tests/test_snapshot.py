"""Snapshots and restore (issue 41 part 1): consistent at one point while writes and merges go
on, self-describing and checksummed, written atomically, verified before restore."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import polyindex
from polyindex.engine import Engine
from polyindex.errors import AlreadyExists, Corrupt, FailedPrecondition, InvalidArgument, NotFound
from polyindex.online.wal_check import check_wal
from polyindex.storage.backup import SNAPSHOT_FILE
from polyindex.storage.restore import verify
from polyindex.storage.verify import verify_data

from conftest import start_server, stop_server

BATCH = 7  # documents per write: a batch is all in a snapshot or not at all


def _batch(b: int) -> list[dict]:
    return [{"id": f"b{b}-{i}", "text": f"batch {b} document {i} alpha beta",
             "metadata": {"batch": b}} for i in range(BATCH)]


def _verified(data: Path) -> None:
    reports = verify_data(data, wal=check_wal)
    assert reports and all(r.ok for r in reports), [r.problems for r in reports]


def _batches_in(coll, upto: int) -> dict[int, int]:
    """batch -> how many of its documents the collection holds (for batches 0..upto-1)."""
    got = coll.get([f"b{b}-{i}" for b in range(upto) for i in range(BATCH)])
    out: dict[int, int] = {}
    for b in range(upto):
        out[b] = sum(d is not None for d in got[b * BATCH:(b + 1) * BATCH])
    return out


def test_snapshot_and_restore_round_trip(tmp_path):
    with Engine(tmp_path / "data", online=True) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None, fields={"batch": "int"})
        for b in range(4):
            coll.add(_batch(b))
        coll.seal()
        coll.add(_batch(4))      # acknowledged, still in the write buffer
        coll.delete(["b0-0", "b1-1"])
        before = coll.query("alpha document 3", k=20, profile="lexical")
        info = coll.snapshot(tmp_path / "snap")
        assert info["documents"] == 5 * BATCH - 2 and info["files"] > 3
    desc = json.loads((tmp_path / "snap" / SNAPSHOT_FILE).read_text())
    assert desc["format"] == "polyindex-snapshot" and desc["format_version"] == 1
    assert desc["config"]["name"] == "c" and desc["config"]["fields"] == {"batch": "int"}
    assert all(set(v) == {"size", "xxh3"} for v in desc["files"].values())
    assert not [p for p in (tmp_path / "snap").parent.iterdir() if p.name.startswith(".")]

    with Engine(tmp_path / "other") as eng:
        got = eng.restore_snapshot(tmp_path / "snap", "copy")
        assert got["collection"] == "copy" and got["documents"] == 5 * BATCH - 2
        coll = eng.collection("copy")
        assert coll.count() == 5 * BATCH - 2
        assert _batches_in(coll, 5) == {0: BATCH - 1, 1: BATCH - 1, 2: BATCH, 3: BATCH, 4: BATCH}
        after = coll.query("alpha document 3", k=20, profile="lexical")
        assert [(h.id, round(h.score, 5)) for h in after] == \
            [(h.id, round(h.score, 5)) for h in before]
        assert coll.query("batch", k=5, filter={"batch": 4}, profile="lexical")
        coll.add(_batch(9))  # a restored collection takes writes
        assert coll.count() == 6 * BATCH - 2
    _verified(tmp_path / "other")


def test_restore_refuses_an_existing_collection_unless_forced(tmp_path):
    with Engine(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(_batch(0))
        coll.snapshot(tmp_path / "snap")
        with pytest.raises(AlreadyExists, match="already exists"):
            coll.snapshot(tmp_path / "snap")
        coll.add(_batch(1))
        with pytest.raises(AlreadyExists, match="--force"):
            eng.restore_snapshot(tmp_path / "snap")
        assert eng.collection("c").count() == 2 * BATCH  # untouched
        eng.restore_snapshot(tmp_path / "snap", force=True)
        assert eng.collection("c").count() == BATCH
        with pytest.raises(NotFound):
            eng.restore_snapshot(tmp_path / "nothing")
        with pytest.raises(InvalidArgument):
            eng.restore_snapshot(tmp_path / "snap", "../x")
    _verified(tmp_path / "data")


@pytest.mark.parametrize("target", ["docs.arrow", "lexical.postings.arrow", SNAPSHOT_FILE,
                                    "manifest.json"])
def test_a_flipped_byte_is_refused_at_restore_naming_the_file(tmp_path, target):
    with Engine(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(_batch(0))
        coll.snapshot(tmp_path / "snap")
    snap = tmp_path / "snap"
    path = next(p for p in sorted(snap.rglob(target)))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with Engine(tmp_path / "other") as eng:
        with pytest.raises(Corrupt) as e:
            eng.restore_snapshot(snap)
        assert str(path) in str(e.value)
        assert eng.list_collections() == []
    assert [p.name for p in (tmp_path / "other").iterdir()] == [".lock"]  # nothing written


def test_a_file_the_snapshot_does_not_list_is_refused(tmp_path):
    with Engine(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(_batch(0))
        coll.snapshot(tmp_path / "snap")
    seg = next((tmp_path / "snap" / "segments").iterdir())
    (seg / "extra.bin").write_bytes(b"x")
    with Engine(tmp_path / "other") as eng, pytest.raises(Corrupt, match="extra.bin"):
        eng.restore_snapshot(tmp_path / "snap")


def test_snapshots_while_writes_and_merges_go_on(tmp_path, setting):
    """Writer and merger threads run; every snapshot holds every batch acknowledged before it
    began and each batch whole or not at all; the files it copies are never collected, and
    once it is done nothing stays pinned."""
    setting("POLYINDEX_MERGE", "0")  # merges come from the test's own thread: none in flight
    with Engine(tmp_path / "data", online=True) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        acked: list[int] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer():
            b = 0
            while not stop.is_set() and b < 400:
                coll.add(_batch(b))
                if b % 5 == 4:  # deletes interleave: every fifth batch loses its first document
                    coll.delete([f"b{b}-0"])
                acked.append(b)
                b += 1

        def merger():
            while not stop.is_set():
                try:
                    coll.seal()
                    coll.compact(max_segments=2)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)
                    return

        threads = [threading.Thread(target=writer), threading.Thread(target=merger)]
        for t in threads:
            t.start()
        taken = []
        try:
            for i in range(4):
                time.sleep(0.3)
                before = list(acked)
                coll.snapshot(tmp_path / f"snap{i}")
                taken.append(before)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors
        assert coll.table.merge_stats["merges"] > 0  # merges ran beside the snapshots
        assert len(acked) > len(taken[-1])  # and writes went on
        # nothing stays pinned after the copies: GC takes every merged-away segment
        import gc as pygc
        pygc.collect()
        coll.table.collect_garbage()
        named = {e.id for e in coll.table.sealed_snapshot().manifest.segments}
        on_disk = {p.name for p in (tmp_path / "data" / "c" / "segments").iterdir()}
        assert on_disk == named, sorted(on_disk - named)
    for i, before in enumerate(taken):
        with Engine(tmp_path / f"restored{i}") as eng:
            eng.restore_snapshot(tmp_path / f"snap{i}")
            coll = eng.collection("c")
            top = max(before, default=-1) + 60
            held = _batches_in(coll, top)
            for b in before:  # acknowledged before the snapshot began: all there
                assert held[b] == (BATCH - 1 if b % 5 == 4 else BATCH), (i, b, held[b])
            for b, n in held.items():  # later batches: whole (its delete or not) or absent
                assert n in (0, BATCH, BATCH - 1 if b % 5 == 4 else BATCH), (i, b, n)
        _verified(tmp_path / f"restored{i}")


def test_a_read_only_handle_refuses_to_snapshot(tmp_path):
    with Engine(tmp_path / "data") as eng:
        eng.create_collection("c", ["lexical"], model=None).add(_batch(0))
    ro = polyindex.open(tmp_path / "data", readonly=True)
    try:
        with pytest.raises(FailedPrecondition, match="through the writer"):
            ro.collection("c").snapshot(tmp_path / "snap")
    finally:
        ro.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["backup.write@3", "backup.fsync@5", "backup.fsync_dir@2",
                                   "backup.rename"])
def test_kill_9_during_a_snapshot_leaves_the_source_and_no_snapshot(tmp_path, cli, point):
    with Engine(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        for b in range(3):
            coll.add(_batch(b))
    manifest = (tmp_path / "data" / "c" / "manifest.json").read_bytes()
    name, _, nth = point.partition("@")
    proc = subprocess.run(cli.command("snapshot", "create", "--data", tmp_path / "data", "-c",
                                      "c", "--to", tmp_path / "snaps" / "s1"),
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "POLYINDEX_FAILPOINTS": f"{name}=crash@{nth or 1}"})
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not (tmp_path / "snaps" / "s1").exists()
    assert (tmp_path / "data" / "c" / "manifest.json").read_bytes() == manifest
    _verified(tmp_path / "data")
    leftovers = [p for p in (tmp_path / "snaps").iterdir()]
    assert all(p.name.startswith(".s1.snapshot-") for p in leftovers)
    for half in leftovers:
        # The interrupted snapshot's dot-folder: without its description it does not
        # restore; killed after the description was written (every file fsynced, the rename
        # not yet done), it is whole and every file checks.
        if (half / SNAPSHOT_FILE).exists():
            assert name in ("backup.fsync_dir", "backup.rename")
            verify(half)
            continue
        with Engine(tmp_path / "other") as eng, pytest.raises(Corrupt, match=SNAPSHOT_FILE):
            eng.restore_snapshot(half)
    # the next snapshot to the same path works
    got = cli("snapshot", "create", "--data", tmp_path / "data", "-c", "c", "--to",
              tmp_path / "snaps" / "s1", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["documents"] == 3 * BATCH


@pytest.mark.slow
def test_the_cli_creates_verifies_lists_restores_and_deletes(tmp_path, cli):
    with Engine(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(_batch(0))
    root = tmp_path / "snaps"
    got = cli("snapshot", "create", "--data", tmp_path / "data", "-c", "c", "--to", root / "s1")
    assert got.returncode == 0 and "snapshot" in got.stdout and "7 documents" in got.stdout, \
        got.stderr
    got = cli("snapshot", "verify", root / "s1", "--json")
    assert got.returncode == 0 and json.loads(got.stdout)["ok"]
    got = cli("snapshot", "list", "--root", root, "--json")
    assert [s["name"] for s in json.loads(got.stdout)] == ["s1"]
    got = cli("snapshot", "restore", root / "s1", "--data", tmp_path / "data")
    assert got.returncode == 2 and "--force" in got.stderr  # a user error (README, exit codes)
    got = cli("snapshot", "restore", root / "s1", "--data", tmp_path / "new", "-c", "d")
    assert got.returncode == 0 and "restored 'd'" in got.stdout, got.stderr
    got = cli("verify", "--data", tmp_path / "new")
    assert got.returncode == 0, got.stdout + got.stderr
    got = cli("snapshot", "create", "-c", "c", "--to", root / "s2")
    assert got.returncode == 2 and "--data DIR or --server" in got.stderr
    got = cli("snapshot", "delete", "s1", "--root", root)
    assert got.returncode == 0 and not (root / "s1").exists()


@pytest.mark.slow
def test_a_snapshot_through_a_server_mid_stream_restores_every_acknowledged_write(tmp_path):
    """Writes stream through a real server (seals and merges going on); a snapshot is taken
    mid-stream; restored elsewhere, it holds every write acknowledged before the snapshot
    call began, and no batch in part."""
    from polyindex.client.remote import Client
    root = tmp_path / "snaps"
    root.mkdir()
    proc, addr = start_server(tmp_path / "data", "--snapshot-root", root,
                              env={"POLYINDEX_SEAL_DOCS": "30", "POLYINDEX_MERGE_FACTOR": "2"})
    try:
        with Client(addr) as client:
            coll = client.create_collection("c", ["lexical"], model=None)
            acked: list[int] = []
            stop = threading.Event()
            failed: list[BaseException] = []

            def stream():
                try:
                    with Client(addr) as mine:
                        c = mine.collection("c")
                        for b in range(2000):
                            if stop.is_set():
                                return
                            c.add(_batch(b))
                            acked.append(b)
                except BaseException as e:  # noqa: BLE001 - reported below
                    failed.append(e)

            t = threading.Thread(target=stream)
            t.start()
            while len(acked) < 40 and t.is_alive():
                time.sleep(0.05)
            before = list(acked)
            info = coll.snapshot("mid")
            after = len(acked)
            time.sleep(0.3)  # writes go on after it
            stop.set()
            t.join()
            assert not failed, failed
            assert len(acked) > after or after > len(before)  # writes did not stop
            assert info["documents"] >= len(before) * BATCH
            listed = client.list_snapshots()
            assert [s["name"] for s in listed] == ["mid"]
            with pytest.raises(InvalidArgument, match="snapshot name"):
                coll.snapshot("../escape")
            with pytest.raises(AlreadyExists) as e:
                coll.snapshot("mid")
            assert str(root) not in str(e.value)  # the server's paths stay its own
    finally:
        code, err = stop_server(proc)
    assert code == 0, err[-2000:]
    with Engine(tmp_path / "restored") as eng:
        eng.restore_snapshot(root / "mid")
        held = _batches_in(eng.collection("c"), len(acked) + 1)
    assert all(held[b] == BATCH for b in before), {b: held[b] for b in before if held[b] != BATCH}
    assert set(held.values()) <= {0, BATCH}
    assert sum(held.values()) == info["documents"]
    _verified(tmp_path / "restored")
    proc, addr = start_server(tmp_path / "data", "--snapshot-root", root)
    try:
        with Client(addr) as client:
            client.delete_snapshot("mid")
            assert client.list_snapshots() == [] and not (root / "mid").exists()
    finally:
        stop_server(proc)
    proc, addr = start_server(tmp_path / "data")
    try:
        with Client(addr) as client, pytest.raises(FailedPrecondition, match="--snapshot-root"):
            client.collection("c").snapshot("x")
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_a_process_group_takes_snapshots_through_its_writer(tmp_path):
    """``serve --processes 2``: a follower forwards CreateSnapshot to the writer, which seals
    first, so a snapshot asked of either process holds the client's acknowledged writes."""
    from polyindex.client.remote import Client
    root = tmp_path / "snaps"
    root.mkdir()
    proc, addr = start_server(tmp_path / "data", "--processes", "2", "--snapshot-root", root)
    try:
        with Client(addr) as client:
            client.create_collection("c", ["lexical"], model=None)
        workers, counts = set(), []
        for i in range(6):  # new connections land on either process (SO_REUSEPORT)
            with Client(addr) as client:
                coll = client.collection("c")
                coll.add(_batch(i))
                counts.append(coll.snapshot(f"s{i}")["documents"])
                workers.add(client.stats()["process"]["worker"])
    finally:
        code, err = stop_server(proc)
    assert code == 0, err[-2000:]
    assert counts == [BATCH * (i + 1) for i in range(6)]
    if len(workers) < 2:
        pytest.skip("every connection landed on one process; the forward was not exercised")
    with Engine(tmp_path / "restored") as eng:
        eng.restore_snapshot(root / "s5")
        assert eng.collection("c").count() == 6 * BATCH


@pytest.mark.slow
def test_a_snapshot_longer_than_the_forward_wait_answers_through_a_follower(tmp_path):
    """The forward's wait bounds reaching the writer, not the snapshot: with the wait at 2.5 s
    and every snapshot's rename paused 5 s (a slow disk), snapshots asked of either process
    succeed (before, a follower answered UNAVAILABLE after the wait)."""
    from polyindex.client.remote import Client
    root = tmp_path / "snaps"
    root.mkdir()
    from polyindex.wire.grpc_errors import Unavailable
    env = {"POLYINDEX_FORWARD_WAIT_S": "2.5", "POLYINDEX_FAILPOINTS": "backup.rename=pause@1"}
    proc, addr = start_server(tmp_path / "data", "--processes", "2", "--snapshot-root", root,
                              env=env)
    try:
        with Client(addr) as client:
            client.create_collection("c", ["lexical"], model=None)
            for _ in range(5):  # setup: a forwarded first upsert (kernels loading on a loaded
                try:            # machine) may itself outlast the short wait; it is idempotent
                    client.collection("c").add(_batch(0))
                    break
                except Unavailable:
                    continue
        workers = set()
        for i in range(8):  # new connections land on either process (SO_REUSEPORT)
            with Client(addr) as client:
                assert client.collection("c").snapshot(f"s{i}")["documents"] == BATCH
                workers.add(client.stats()["process"]["worker"])
            if len(workers) == 2:  # a snapshot through the follower answered
                break
    finally:
        code, err = stop_server(proc)
    assert code == 0, err[-2000:]
    if len(workers) < 2:
        pytest.skip("every connection landed on one process; the forward was not exercised")


def test_every_file_and_folder_is_fsynced_before_the_rename_and_an_error_leaves_nothing(tmp_path):
    from polyindex.storage import failpoints
    with Engine(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(_batch(0))
        with failpoints.record() as log:
            coll.snapshot(tmp_path / "snap")
        mine = [(p, path) for p, path in log if p.startswith("backup.")]
        renamed = next(i for i, (p, _) in enumerate(mine) if p == "backup.rename")
        synced = {path for p, path in mine[:renamed] if p in ("backup.fsync", "backup.fsync_dir")}
        tmp = Path(mine[renamed][1]).parent / next(
            Path(path).relative_to(tmp_path).parts[0] for p, path in mine if p == "backup.write")
        for p in tmp_path.joinpath("snap").rglob("*"):
            assert str(tmp / p.relative_to(tmp_path / "snap")) in synced, p
        assert str(tmp) in synced and mine[renamed + 1][0] == "backup.fsync_dir"
        with failpoints.armed("backup.fsync", "error", nth=3):
            with pytest.raises(OSError):
                coll.snapshot(tmp_path / "snap2")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "snap"]


@pytest.mark.slow
def test_a_sharded_collection_refuses_with_its_reason(tmp_path):
    from polyindex.distributed.serving import ShardedEngine
    eng = ShardedEngine.in_process(tmp_path / "sharded", shards=2)
    try:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.add(_batch(0))
        with pytest.raises(FailedPrecondition, match="sharded.*coordinated seal"):
            coll.snapshot(str(tmp_path / "snap"))
        assert not (tmp_path / "snap").exists()
    finally:
        eng.close()
