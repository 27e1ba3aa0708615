"""Acknowledged writes survive failed seals, WAL damage, drops and second writers.

Each test reproduces one of the ways writes were lost (issue 16) with the real engine on a
lexical-only collection (no model to load), faults injected through the failpoints.
"""
from __future__ import annotations

import shutil
import threading
import time

import pytest

import polyindex
from polyindex import (Corrupt, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted,
                       StorageFailed)
from polyindex.online.wal import HEADER, MAGIC, WriteAheadLog
from polyindex.storage import failpoints
from polyindex.storage.manifest import load_manifest


@pytest.fixture(autouse=True)
def _disarmed():
    yield
    failpoints.disarm()


def docs(prefix, n, text="alpha"):
    return [{"id": f"{prefix}{i}", "text": f"{text} {prefix} {i}"} for i in range(n)]


def online(path, **kw):
    eng = polyindex.open(path, online=True)
    if "c" not in eng.list_collections():
        eng.create_collection("c", ["lexical"])
    coll = eng.collection("c")
    coll.live.writes.seal_docs, coll.live.writes.seal_seconds = kw.get("seal_docs", 10**9), 1e9
    if not kw.get("background", True):  # seals only when the test says so
        coll.live.writes._stop.set()
        coll.live.writes._thread.join()
    return eng, coll


def ids_of(coll) -> set[str]:
    return {h.id for h in coll.query("alpha", profile="lexical", k=10_000)}


# ------------------------------------------------------------------------- failed seals

def test_a_failed_seal_keeps_every_acknowledged_write(tmp_path):
    eng, coll = online(tmp_path, background=False)
    coll.add(docs("a", 10))
    with failpoints.armed("commit.segment.rename", "error"):
        with pytest.raises(OSError):
            coll.seal()
    assert ids_of(coll) == {f"a{i}" for i in range(10)}  # still served from the frozen buffer
    coll.add(docs("b", 5))
    assert coll.info()["seal_failures"] == 1
    coll.seal()  # the retry commits the frozen buffer, never overwritten by the newer writes
    coll.seal()
    assert coll.info()["seal_failures"] == 0 and coll.info()["buffered_docs"] == 0
    eng.close()
    with polyindex.open(tmp_path) as again:
        assert ids_of(again.collection("c")) == {f"a{i}" for i in range(10)} | \
            {f"b{i}" for i in range(5)}


def test_a_failing_sealer_is_retried_and_bounds_the_backlog(tmp_path):
    eng, coll = online(tmp_path)
    w = coll.live.writes
    w.max_backlog = 30
    coll.add(docs("a", 20))
    failpoints.arm("commit.manifest.rename", "enospc", nth=1)
    with pytest.raises(OSError, match="No space left"):
        coll.seal()
    coll.add(docs("b", 10))  # 30 unsealed: still within the bound
    with pytest.raises(ResourceExhausted, match="sealing keeps failing"):
        coll.add(docs("c", 1))
    assert "c0" not in ids_of(coll)
    w.seal_seconds = 0.0  # let the background sealer retry (after its backoff)
    deadline = time.monotonic() + 10
    while (w.frozen is not None or w.seal_failures) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.seal_failures == 0
    coll.add(docs("c", 1))  # writes resume once a seal succeeded
    eng.close()
    with polyindex.open(tmp_path) as again:
        assert len(ids_of(again.collection("c"))) == 31


def test_an_upsert_that_fails_leaves_nothing_behind(tmp_path):
    eng, coll = online(tmp_path)
    coll.add(docs("a", 3))
    wal = coll.folder / "wal" / f"wal-{1:08d}.log"
    size = wal.stat().st_size
    for point in ("wal.append.write", "wal.append.fsync"):
        with failpoints.armed(point, "enospc"):
            with pytest.raises(ResourceExhausted, match="disk is full"):
                coll.add(docs("x", 2))
        assert wal.stat().st_size == size  # the partial frame was removed
        assert not ids_of(coll) & {"x0", "x1"}
    coll.add(docs("b", 1))
    eng.close()
    with polyindex.open(tmp_path, online=True) as again:
        assert ids_of(again.collection("c")) == {"a0", "a1", "a2", "b0"}


def test_an_append_that_fails_with_an_io_error_is_a_polyindex_error_and_keeps_nothing(tmp_path):
    """EIO (not a full disk) at the WAL append: UNAVAILABLE with the log's path, still an
    OSError for code that reads errno, and nothing of the write is kept."""
    eng, coll = online(tmp_path)
    coll.add(docs("a", 2))
    for point in ("wal.append.write", "wal.append.fsync"):
        with failpoints.armed(point, "error"):
            with pytest.raises(StorageFailed, match="write-ahead log append failed") as err:
                coll.add(docs("x", 2))
        assert err.value.status == "UNAVAILABLE" and isinstance(err.value, OSError)
        assert "wal-" in str(err.value) and not ids_of(coll) & {"x0", "x1"}
    coll.add(docs("b", 1))
    eng.close()
    with polyindex.open(tmp_path, online=True) as again:
        assert ids_of(again.collection("c")) == {"a0", "a1", "b0"}


def test_replay_skips_what_the_manifest_covers(tmp_path):
    """A crash between the seal's commit and the WAL cleanup must not re-apply old writes
    over newer ones made after the seal."""
    eng, coll = online(tmp_path)
    coll.add([{"id": "a", "text": "alpha old"}])
    with failpoints.armed("wal.drop.unlink", "error"):
        coll.seal()  # committed; the WAL file holding "old" could not be deleted
    eng.close()
    assert load_manifest(tmp_path / "c").wal_through == 1
    with polyindex.open(tmp_path) as bulk:  # a newer write by the next writer
        bulk.collection("c").add([{"id": "a", "text": "alpha new"}])
    with polyindex.open(tmp_path, online=True) as again:
        assert again.collection("c").get(["a"])[0].text == "alpha new"


# ------------------------------------------------------------------------- the WAL

def _log_with(tmp_path, n_files=1, per_file=5):
    log = WriteAheadLog(tmp_path)
    for f in range(n_files):
        if f:
            log.rotate()
        for i in range(per_file):
            log.append({"op": "delete", "ids": [f"{f}-{i}"]})
    log.close()
    return sorted(tmp_path.glob("wal-*.log"))


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("where", [0.0, 0.1, 0.5, 0.7])
def test_a_bad_byte_inside_the_newest_file_is_corruption_not_a_torn_tail(tmp_path, where):
    """Anywhere before the last record (5 records: the last starts past 80%)."""
    (newest,) = _log_with(tmp_path)
    size = newest.stat().st_size
    damaged = _flip(newest, int(size * where))
    with pytest.raises(Corrupt, match=f"{newest.name}.*at byte \\d+"):
        WriteAheadLog(tmp_path)
    assert newest.read_bytes() == damaged  # evidence kept: never truncated or rewritten


def test_damage_in_an_older_file_is_corruption_even_at_its_end(tmp_path):
    old, newest = _log_with(tmp_path, n_files=2)
    _flip(old, old.stat().st_size - 1)
    with pytest.raises(Corrupt, match=old.name):
        WriteAheadLog(tmp_path)


def test_only_an_incomplete_final_record_is_a_torn_tail(tmp_path):
    (newest,) = _log_with(tmp_path)
    good = newest.read_bytes()
    last_start = good.rfind(MAGIC.to_bytes(2, "little"))
    newest.write_bytes(good[:-3])  # the last append was cut short by a crash
    log = WriteAheadLog(tmp_path)
    assert [r["ids"] for _, r in log.replay()] == [[f"0-{i}"] for i in range(4)]
    assert newest.read_bytes() == good[:last_start]
    assert (tmp_path / "torn" / f"{newest.name}.at{last_start}").read_bytes() == \
        good[last_start:-3]
    assert log.append({"op": "delete", "ids": ["next"]}) == 5  # numbering goes on
    log.close()


def test_a_final_record_with_a_bad_checksum_is_a_torn_tail_kept_as_evidence(tmp_path):
    """A power loss mid-append can leave the frame's length on disk but not all its bytes;
    nothing valid follows, so it was never acknowledged (its bytes are kept in torn/)."""
    (newest,) = _log_with(tmp_path)
    damaged = _flip(newest, newest.stat().st_size - 1)
    log = WriteAheadLog(tmp_path)
    assert len(list(log.replay())) == 4
    (kept,) = (tmp_path / "torn").iterdir()
    assert damaged.endswith(kept.read_bytes())
    log.close()


def test_sequence_numbers_increase_across_files_and_reopens(tmp_path):
    _log_with(tmp_path, n_files=3, per_file=2)
    log = WriteAheadLog(tmp_path, after=2)
    assert [s for s, _ in log.replay()] == [3, 4, 5, 6]
    assert log.append({"op": "delete", "ids": ["z"]}) == 7
    log.drop_through(4)  # files wholly at or below 4 go; the one being appended to stays
    log.close()
    assert [s for s, _ in WriteAheadLog(tmp_path, after=4).replay()] == [5, 6, 7]


def test_format_1_records_still_replay(tmp_path):
    import json
    import struct
    import zlib
    payload = json.dumps({"op": "delete", "ids": ["old"]}).encode()
    (tmp_path / f"wal-{1:08d}.log").write_bytes(
        struct.pack("<HII", 0x5057, len(payload), zlib.crc32(payload)) + payload)
    log = WriteAheadLog(tmp_path)
    assert list(log.replay()) == [(1, {"op": "delete", "ids": ["old"]})]
    assert log.append({"op": "delete", "ids": ["new"]}) == 2
    log.close()


def test_a_torn_frame_is_never_rotated_into_an_older_file(tmp_path):
    """Disk full mid-append, then a crash: the next open cuts the torn frame before it appends
    or rotates, so the collection opens afterwards instead of answering DATA_LOSS."""
    eng, coll = online(tmp_path)
    coll.add(docs("a", 2))
    eng.close()
    wal = sorted((tmp_path / "c" / "wal").glob("wal-*.log"))[-1]
    with open(wal, "ab") as f:
        f.write(HEADER.pack(MAGIC, 500, 9, 0) + b"cut")
    eng, coll = online(tmp_path)
    coll.add(docs("b", 1))
    coll.live.writes.wal.rotate()
    coll.add(docs("c", 1))
    eng.close()
    with polyindex.open(tmp_path, online=True) as again:
        assert ids_of(again.collection("c")) == {"a0", "a1", "b0", "c0"}


# ------------------------------------------------------------------------- one writer

def test_a_second_writer_is_refused_and_says_who_holds_the_directory(tmp_path):
    first = polyindex.open(tmp_path)
    with pytest.raises(FailedPrecondition, match=r"already open for writing by process \d+"):
        polyindex.open(tmp_path)
    with pytest.raises(FailedPrecondition):
        polyindex.open(tmp_path, online=True)
    first.close()
    polyindex.open(tmp_path).close()  # released by close


def test_a_reader_follows_the_writers_commits_within_a_bounded_time(tmp_path):
    writer = polyindex.open(tmp_path)
    coll = writer.create_collection("c", ["lexical"])
    coll.add(docs("a", 3))
    reader = polyindex.open(tmp_path, readonly=True)
    seen = reader.collection("c")
    assert seen.count() == 3
    with pytest.raises(FailedPrecondition, match="read-only"):
        seen.add(docs("r", 1))
    with pytest.raises(FailedPrecondition, match="read-only"):
        reader.create_collection("d", ["lexical"])
    coll.add(docs("b", 500))
    t0 = time.monotonic()
    while seen.count() != 503:
        assert time.monotonic() - t0 < 2.0, "the reader did not pick up the new manifest"
        time.sleep(0.01)
    writer.drop_collection("c")
    writer.create_collection("c", ["lexical"]).add(docs("z", 1))
    t0 = time.monotonic()
    while True:  # a dropped and re-created collection is the new one, never a mix
        try:
            if reader.collection("c").count() == 1:
                break
        except NotFound:
            pass
        assert time.monotonic() - t0 < 2.0
        time.sleep(0.01)
    writer.close()


def test_a_reader_looks_at_the_folder_at_most_every_recheck_or_when_told(tmp_path, monkeypatch):
    """A reader's handle is checked against its folder (dropped? re-created?) at most every
    RECHECK_S, not by a stat per query; at once when reading the manifest found it gone, or
    after ``forget`` (a follower that forwarded the drop or the create)."""
    from polyindex.storage import table
    writer = polyindex.open(tmp_path)
    writer.create_collection("c", ["lexical"]).add(docs("old", 2))
    reader = polyindex.open(tmp_path, readonly=True)
    stale = reader.collection("c")
    monkeypatch.setattr(table, "RECHECK_S", 3600.0)  # never looked at again by itself

    def recreate(n):
        writer.drop_collection("c")
        writer.create_collection("c", ["lexical"]).add(docs("new", n))
    recreate(3)
    assert reader.collection("c") is stale  # not looked at: the interval has not passed
    with pytest.raises(NotFound, match="created again"):
        stale.table.sealed_snapshot()  # what a follower's catch-up reads
    fresh = reader.collection("c")
    assert fresh is not stale and fresh.count() == 3
    recreate(4)
    assert reader.collection("c") is fresh
    reader.forget("c")
    assert reader.collection("c").count() == 4
    with pytest.raises(FailedPrecondition, match="read-only"):
        writer.forget("c")
    writer.close()


def test_read_only_needs_an_existing_directory(tmp_path):
    with pytest.raises(NotFound, match="does not exist"):
        polyindex.open(tmp_path / "nope", readonly=True)
    assert not (tmp_path / "nope").exists()


# ------------------------------------------------------------------------- lifecycle

def test_drop_and_recreate_never_mixes_incarnations(tmp_path):
    eng, coll = online(tmp_path)
    coll.add(docs("old", 10))  # buffered, not sealed
    eng.drop_collection("c")
    with pytest.raises(NotFound):
        coll.add(docs("stale", 1))  # a handle of the dropped collection
    with pytest.raises(NotFound):
        coll.query("alpha", profile="lexical")
    new = eng.create_collection("c", ["lexical"])
    new.add(docs("new", 10))
    crashed = tmp_path.parent / f"{tmp_path.name}-crash"
    shutil.copytree(tmp_path, crashed)  # what a kill -9 now would leave
    (crashed / ".lock").unlink()
    assert ids_of(new) == {f"new{i}" for i in range(10)}
    eng.close()
    for path in (tmp_path, crashed):
        with polyindex.open(path) as again:
            assert ids_of(again.collection("c")) == {f"new{i}" for i in range(10)}


def test_drop_cycles_leak_no_threads(tmp_path):
    eng = polyindex.open(tmp_path, online=True)
    eng.create_collection("c", ["lexical"]).add(docs("a", 1))
    before = threading.active_count()
    for i in range(30):
        eng.drop_collection("c")
        eng.create_collection("c", ["lexical"]).add(docs(f"r{i}-", 2))
    assert threading.active_count() <= before + 1
    assert eng.collection("c").count() == 2
    eng.close()


def test_create_racing_itself_makes_one_collection_and_answers_ok(tmp_path):
    eng = polyindex.open(tmp_path, online=True)
    results, barrier = [], threading.Barrier(16)

    def create():
        barrier.wait()
        try:
            results.append(eng.create_collection("c", ["lexical"], exist_ok=True))
        except Exception as e:  # noqa: BLE001 - asserted below
            results.append(e)

    threads = [threading.Thread(target=create) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results), results
    assert eng.list_collections() == ["c"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".c.")]
    eng.close()


def test_calls_racing_a_drop_get_ok_or_not_found(tmp_path):
    eng = polyindex.open(tmp_path, online=True)
    eng.create_collection("c", ["lexical"])
    stop, bad = threading.Event(), []

    def hammer(kind):
        n = 0
        while not stop.is_set():
            n += 1
            try:
                coll = eng.collection("c")
                if kind == "write":
                    coll.add(docs(f"w{n}-", 2))
                else:
                    coll.query("alpha", profile="lexical")
            except NotFound:
                pass
            except Exception as e:  # noqa: BLE001 - asserted below
                bad.append(repr(e))

    threads = [threading.Thread(target=hammer, args=(k,)) for k in ("write", "write", "read")]
    for t in threads:
        t.start()
    for _ in range(15):
        time.sleep(0.02)
        eng.drop_collection("c")
        eng.create_collection("c", ["lexical"])
    stop.set()
    for t in threads:
        t.join()
    eng.close()
    assert not bad, bad[:5]


# ------------------------------------------------------------------------- small ones

def test_names_with_a_trailing_newline_are_refused(tmp_path):
    with polyindex.open(tmp_path) as eng:
        with pytest.raises(InvalidArgument, match="invalid collection name"):
            eng.create_collection("foo\n", ["lexical"])


def test_absurd_query_vectors_are_refused(tmp_path):
    with polyindex.open(tmp_path) as eng:
        coll = eng.create_collection("c", ["lexical"])
        for bad, why in (([3e38] * 4, "absurd"), ([float("nan")] * 4, "NaN")):
            with pytest.raises(InvalidArgument, match=why):
                coll.query(vector=bad, profile="lexical")


@pytest.fixture
def small_disk(tmp_path):
    """A real 3 MiB filesystem (tmpfs), so that writes meet a real ENOSPC."""
    import os
    import subprocess
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_answers_resource_exhausted_and_loses_nothing(small_disk):
    data = small_disk / "D"
    eng, coll = online(data, background=False)
    acked, refused = [], 0
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1 << 20))  # freed later: room for the seal
    for i in range(400):
        batch = [{"id": f"b{i}-{j}", "text": f"alpha {i} {j} " + "word " * 400} for j in range(4)]
        try:
            coll.add(batch)
            acked += [d["id"] for d in batch]
        except ResourceExhausted as e:
            assert "disk is full" in str(e)
            refused += 1
            assert not {d["id"] for d in batch} & ids_of(coll)  # nothing of it visible
            if refused == 3:
                break
    assert refused == 3 and acked
    assert ids_of(coll) == set(acked)
    filler.unlink()
    eng.close()
    with polyindex.open(data, readonly=True) as again:
        assert ids_of(again.collection("c")) == set(acked)


def test_bulk_index_beside_a_server_goes_through_it(tmp_path, cli):
    """The bulk CLI against a served directory is refused with directions; `--server` sends
    the documents through the server; a second server on the directory fails at start."""
    import json
    import re
    import signal
    import subprocess
    data = tmp_path / "D"
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "text": f"alpha served {i}"}) + "\n"
                           for i in range(2500)))
    proc = subprocess.Popen(cli.command("serve", "--data", data, "--port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = re.search(r"serving on (\S+)", proc.stdout.readline())
        assert m, proc.stderr.read()
        res = cli("index", src, "--data", data, "--collection", "c", "--index", "lexical")
        assert res.returncode == 1 and "FAILED_PRECONDITION" in res.stderr
        assert "--server HOST:PORT" in res.stderr and f"process {proc.pid}" in res.stderr
        second = cli("serve", "--data", data, "--port", "0", timeout=120)
        assert second.returncode == 1 and "already open for writing" in second.stderr
        res = cli("index", src, "--data", data, "--collection", "c", "--index", "lexical",
                  "--server", m.group(1), "--json", "--no-progress")
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)
        assert report["indexed"] == report["documents"] == 2500 and report["batches"] == 3
        info = cli("info", "--data", data, "--collection", "c", "--json")  # a reader, beside it
        assert info.returncode == 0, info.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    with polyindex.open(data, readonly=True) as eng:
        assert eng.collection("c").count() == 2500
