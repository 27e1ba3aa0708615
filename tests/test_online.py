"""Online writes: WAL before ack, visible at once, sealed later, replayed after a crash."""
import shutil
import threading

import pytest

import polyindex
from polyindex import Corrupt
from polyindex.online.wal import HEADER, MAGIC, WriteAheadLog


def docs(prefix, n, text="alpha beta"):
    return [{"id": f"{prefix}{i}", "text": f"{text} {prefix} number{i}"} for i in range(n)]


@pytest.fixture
def online(tmp_path):
    eng = polyindex.open(tmp_path / "data", online=True)
    coll = eng.create_collection("c", ["lexical"])
    yield eng, coll
    eng.close()


def test_writes_are_visible_before_sealing(online):
    eng, coll = online
    assert coll.add(docs("a", 5)) == 5
    assert coll.count() == 5
    assert coll.info()["segments"] == 0 and coll.info()["buffered_docs"] == 5
    assert coll.info()["wal_bytes"] > 0
    assert {h.id for h in coll.query("alpha", profile="lexical", k=10)} == {f"a{i}" for i in range(5)}
    assert coll.get(["a3"])[0].text == "alpha beta a number3"
    assert coll.delete(["a3", "nope"]) == 1
    assert coll.count() == 4 and coll.get(["a3"]) == [None]
    coll.add([{"id": "a1", "text": "gamma replaced"}])
    assert coll.count() == 4
    assert [h.id for h in coll.query("gamma", profile="lexical")] == ["a1"]
    assert "a1" not in {h.id for h in coll.query("alpha", profile="lexical", k=10)}


def test_seal_commits_and_drops_wal(online):
    eng, coll = online
    coll.add(docs("a", 10))
    coll.seal()
    info = coll.info()
    assert info["segments"] == 1 and info["buffered_docs"] == 0 and info["documents"] == 10
    # updates and deletes of sealed rows are hidden by the buffer, then committed by the seal
    coll.add([{"id": "a2", "text": "delta new"}])
    coll.delete(["a5"])
    hits = {h.id for h in coll.query("alpha", profile="lexical", k=20)}
    assert "a2" not in hits and "a5" not in hits and len(hits) == 8
    assert coll.count() == 9
    coll.seal()
    info = coll.info()
    assert info["segments"] == 2 and info["documents"] == 9 and info["deleted_rows"] == 2
    assert [h.id for h in coll.query("delta", profile="lexical")] == ["a2"]
    assert sorted(p.name for p in (coll.folder / "wal").iterdir()) == [f"wal-{3:08d}.log"]


def test_replay_after_crash_and_torn_tail(online, tmp_path):
    eng, coll = online
    coll.add(docs("a", 4))
    coll.delete(["a0"])
    coll.add([{"id": "a1", "text": "latest version"}])
    crashed = tmp_path / "crashed"
    shutil.copytree(eng.path, crashed)  # the files as a crash would leave them: nothing sealed
    wal = crashed / "c" / "wal" / f"wal-{1:08d}.log"
    good = wal.stat().st_size
    torn = HEADER.pack(MAGIC, 100, 4, 0) + b"partial"
    with open(wal, "ab") as f:  # a torn, unacknowledged append
        f.write(torn)
    again = polyindex.open(crashed, online=True).collection("c")
    assert again.count() == 3
    assert again.get(["a0"]) == [None] and again.get(["a1"])[0].text == "latest version"
    assert wal.stat().st_size == good  # the torn record was cut off ...
    kept = list((wal.parent / "torn").iterdir())  # ... and its bytes kept as evidence
    assert [p.read_bytes() for p in kept] == [torn] and kept[0].name.endswith(f".at{good}")
    again.add([{"id": "z", "text": "after restart"}])
    again.close()
    third = polyindex.open(crashed, online=True).collection("c")
    assert third.count() == 4 and third.info()["segments"] == 1
    third.close()


def test_damage_in_an_older_wal_file_is_corruption(tmp_path):
    log = WriteAheadLog(tmp_path)
    log.append({"op": "delete", "ids": ["x"]})
    log.rotate()
    log.append({"op": "delete", "ids": ["y"]})
    log.close()
    first = tmp_path / f"wal-{1:08d}.log"
    data = bytearray(first.read_bytes())
    data[-2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(Corrupt, match="checksum mismatch"):
        list(WriteAheadLog(tmp_path).replay())


def test_concurrent_queries_during_writes_and_seals(online):
    eng, coll = online
    coll.add(docs("base", 50))
    errors, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                hits = coll.query("alpha", profile="lexical", k=1000)
                ids = [h.id for h in hits]
                assert len(ids) == len(set(ids)), "duplicate ids in one result"
                assert len(ids) >= 50
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for round_ in range(15):
        coll.add(docs(f"r{round_}-", 5))
        coll.add([{"id": "base1", "text": f"alpha rewritten {round_}"}])
        if round_ % 4 == 3:
            coll.seal()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert coll.count() == 50 + 15 * 5
    assert coll.get(["base1"])[0].text == "alpha rewritten 14"


def test_dense_buffer_merges_and_seals_with_stored_vectors(tmp_path):
    eng = polyindex.open(tmp_path / "d", online=True)
    coll = eng.create_collection("d", ["lexical", "dense"])
    for i in range(12):  # more buffer segments than are kept before merging
        coll.add([{"id": f"d{i}", "text": f"note {i} about {['cats', 'rockets', 'soup'][i % 3]}"}])
    assert len(coll.view().segments) <= 9
    before = [(h.id, round(h.score, 5)) for h in coll.query("space launch", profile="dense", k=4)]
    assert before[0][0] in {"d1", "d4", "d7", "d10"}
    coll.seal()
    after = [(h.id, round(h.score, 5)) for h in coll.query("space launch", profile="dense", k=4)]
    assert before == after  # sealed vectors are the buffered ones, not re-encoded differently
    eng.close()


def test_a_write_prepares_the_live_masks_it_makes(tmp_path):
    """A rewrite hides a sealed row under a new live mask: the write itself counts the
    mask's lexical statistics and builds its dense allow bitmap and search parameters, so
    the first query after it finds them (and answers as a fresh search would)."""
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    eng = polyindex.open(tmp_path / "data", online=True)
    try:
        coll = eng.create_collection("c", ["lexical", "dense:metric=l2,HNSW8,Flat"],
                                     model=None)
        coll.add([{"id": f"d{i}", "text": f"alpha w{i % 7}", "vector": x[i]} for i in range(300)])
        coll.seal()
        coll.add([{"id": "d5", "text": "beta", "vector": x[5]}])  # hides sealed row 5
        snap = coll.view()
        live = snap.live[0]
        assert live is not None and not live[5] and live.sum() == 299
        lexical, dense = snap.segments[0].indexes["lexical"], snap.segments[0].indexes["dense"]
        count, total = lexical.live_stats.get(live, lambda: pytest.fail("not prepared"))
        assert count == 299 and total == int(lexical.doclen.sum()) - int(lexical.doclen[5])
        prepared = dense.__dict__["_allowed"].get((live,))
        assert prepared is not None and prepared.n == 299 and prepared.direct
        hits = coll.query(vector=x[5], k=3, profile="dense")
        assert hits[0].id == "d5" and len({h.id for h in hits}) == 3
        # later writes derive the statistics from the previous mask's: a new hidden row
        # counts, a row hidden already (d5 deleted now) does not
        from polyindex.index.lexical.kind import _live_stats
        coll.add([{"id": "d7", "text": "gamma", "vector": x[7]}])
        coll.delete(["d5", "d9"])
        live = coll.view().live[0]
        assert live.sum() == 297 and not live[[5, 7, 9]].any()
        got = lexical.live_stats.get(live, lambda: pytest.fail("not prepared"))
        assert got == _live_stats(lexical, live)
        assert coll.count() == 298
        assert [h.id for h in coll.query("gamma", profile="lexical")] == ["d7"]
    finally:
        eng.close()
