"""Read-only followers see the writer's acknowledged writes before they are sealed (issue 19).

A follower (``polyindex.open(path, readonly=True)``) tails the writer's WAL above the
manifest's ``wal_through`` into its own buffer: upserts and deletes show without a seal, a
seal changes nothing it answers, it never writes the data directory, a write in progress at
the log's end is read later, and damage the writer's recovery would call corruption is
DATA_LOSS without any file being touched. Writer and follower share this process (the
follower takes no lock); the multi-process server is tested in test_processes.py.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import polyindex
from polyindex import Corrupt
from polyindex.online.view import decode_array, encode_array, net_changes
from polyindex.online.wal import HEADER, MAGIC

DEADLINE_S = 5.0  # generous: the bound is RECHECK_S (50 ms); this only avoids hanging


def docs(prefix, n, text="alpha"):
    return [{"id": f"{prefix}{i}", "text": f"{text} {prefix} {i}"} for i in range(n)]


def writer(path):
    eng = polyindex.open(path, online=True)
    coll = eng.create_collection("c", ["lexical"])
    coll.live.writes.seal_docs, coll.live.writes.seal_seconds = 10**9, 1e9  # seals when the test says
    return eng, coll


def ids_of(coll) -> set[str]:
    return {h.id for h in coll.query("alpha", profile="lexical", k=10_000)}


def eventually(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        time.sleep(0.005)


def tree(path) -> dict[str, tuple]:
    """Every file and folder under ``path`` with its size and modification time."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.stat(p)
            out[os.path.relpath(p, path)] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_follower_sees_unsealed_upserts_and_deletes(tmp_path):
    eng, coll = writer(tmp_path)
    coll.add(docs("a", 5))
    reader = polyindex.open(tmp_path, readonly=True).collection("c")
    assert ids_of(reader) == {f"a{i}" for i in range(5)}  # unsealed, read at open
    assert reader.info()["segments"] == 0
    coll.add([{"id": "a1", "text": "alpha rewritten"}, {"id": "b", "text": "alpha beta"}])
    coll.delete(["a0", "nope"])
    eventually(lambda: ids_of(reader) == {"a1", "a2", "a3", "a4", "b"}, "upsert and delete")
    assert reader.get(["a1"])[0].text == "alpha rewritten"
    assert reader.count() == coll.count() == 5
    assert [h.id for h in reader.query("beta", profile="lexical")] == ["b"]
    # same scores as the writer: the same buffer segments and collection statistics
    ours = [(h.id, round(h.score, 5)) for h in reader.query("alpha a", profile="lexical")]
    assert ours == [(h.id, round(h.score, 5)) for h in coll.query("alpha a", profile="lexical")]
    coll.seal()  # a seal moves the writes into a segment: the reader's answers do not change
    eventually(lambda: reader.info()["segments"] == 1, "the seal")
    assert ids_of(reader) == {"a1", "a2", "a3", "a4", "b"}
    assert reader.info()["buffered_docs"] == 0
    coll.add(docs("z", 2))  # into the new WAL file the seal rotated to
    eventually(lambda: {"z0", "z1"} <= ids_of(reader), "writes after a seal")
    assert reader.count() == 7
    eng.close()
    reader_engine = polyindex.open(tmp_path, readonly=True)
    assert reader_engine.collection("c").count() == 7
    reader_engine.close()


def test_a_forced_catch_up_shows_a_write_at_once(tmp_path):
    eng, coll = writer(tmp_path)
    reader = polyindex.open(tmp_path, readonly=True).collection("c")
    assert reader.count() == 0
    coll.add(docs("a", 3))
    reader.catch_up()  # what a follower does after forwarding a write: no wait at all
    assert reader.count() == 3
    eng.close()


def test_a_follower_never_writes_the_data_directory(tmp_path):
    eng, coll = writer(tmp_path)
    coll.add(docs("a", 20))
    coll.seal()
    coll.add(docs("b", 20))
    coll.delete(["a3"])
    eng.close()  # seals; then an unsealed WAL as a killed server leaves it
    with polyindex.open(tmp_path, online=True) as w:
        c = w.collection("c")
        c.live.writes.seal_docs, c.live.writes.seal_seconds = 10**9, 1e9
        c.add(docs("c", 5))
        c.live.writes._stop.set()  # no seal at close: keep the WAL as a crash would
        c.live.writes.seal = lambda *_: None
    before = tree(tmp_path)
    assert any(p.startswith(os.path.join("c", "wal")) for p in before)
    reader = polyindex.open(tmp_path, readonly=True)
    coll = reader.collection("c")
    assert coll.count() == 44
    coll.query("alpha", profile="lexical")
    reader.close()
    assert tree(tmp_path) == before


def _frame(seq: int, payload: bytes) -> bytes:
    from polyindex.online.wal import _checksum
    return HEADER.pack(MAGIC, len(payload), seq, _checksum(seq, payload)) + payload


def _newest_wal(path):
    return sorted((path / "c" / "wal").glob("wal-*.log"))[-1]


def test_a_write_in_progress_at_the_end_is_read_later(tmp_path):
    eng, coll = writer(tmp_path)
    coll.add(docs("a", 2))
    reader = polyindex.open(tmp_path, readonly=True).collection("c")
    assert reader.count() == 2
    eng.close()
    # what a reader may see mid-append: the first bytes of the next frame
    wal = _newest_wal(tmp_path)  # the close sealed and rotated: an empty file
    frame = _frame(load_through(tmp_path) + 1,
                   b'{"op":"upsert","docs":[["x","","alpha x",{}]]}')
    with open(wal, "ab") as f:
        f.write(frame[:10])
    time.sleep(0.06)
    assert reader.count() == 2  # not an error, not yet visible
    with open(wal, "ab") as f:
        f.write(frame[10:])
    eventually(lambda: reader.count() == 3, "the completed frame")
    assert wal.read_bytes() == frame  # nothing cut or rewritten


def load_through(path) -> int:
    from polyindex.storage.manifest import load_manifest
    return load_manifest(path / "c").wal_through


@pytest.mark.parametrize("damage", ["middle", "order"])
def test_corruption_is_data_loss_and_nothing_is_touched(tmp_path, damage):
    eng, coll = writer(tmp_path)
    coll.add(docs("a", 1))
    reader = polyindex.open(tmp_path, readonly=True).collection("c")
    assert reader.count() == 1
    wal = _newest_wal(tmp_path)
    seq = load_through(tmp_path) + 2
    good = _frame(seq, b'{"op":"delete","ids":["a0"]}')
    if damage == "middle":  # a bad frame followed by a valid one
        bad = bytearray(_frame(seq, b'{"op":"delete","ids":["zz"]}'))
        bad[-3] ^= 0xFF
        extra = bytes(bad) + _frame(seq + 1, b'{"op":"delete","ids":["a0"]}')
    else:  # a sequence number that goes back
        extra = good + _frame(seq - 1, b'{"op":"delete","ids":["a0"]}')
    with open(wal, "ab") as f:
        f.write(extra)
    before = wal.read_bytes()
    time.sleep(0.06)
    with pytest.raises(Corrupt, match=r"wal-\d+\.log"):
        reader.count()
    with pytest.raises(Corrupt):  # for every later call, until reopened
        reader.query("alpha", profile="lexical")
    assert wal.read_bytes() == before
    coll.live.writes._stop.set()
    coll.live.writes.seal = lambda *_: None  # the writer would seal its own view at close
    eng.close()


def test_wal_records_carry_exact_embeddings():
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    assert np.array_equal(decode_array(encode_array(a)), a)
    records = [(1, {"op": "upsert", "docs": [["x", "", "one", {}], ["y", "", "two", {}]],
                    "emb": encode_array(a[:2])}),
               (2, {"op": "delete", "ids": ["x"]}),
               (3, {"op": "upsert", "docs": [["y", "", "three", {}]], "emb": encode_array(a[2:])})]
    docs_, stored, deleted = net_changes(records)
    assert list(docs_) == ["y"] and docs_["y"].text == "three" and deleted == {"x"}
    assert np.array_equal(stored["y"], a[2])


def test_wal_records_carry_user_vectors_and_tokens_exactly_in_either_form(tmp_path):
    """The writer stores a document's vectors and token matrix as base64 float32; records
    written before (JSON lists of numbers) still replay to the same arrays."""
    rng = np.random.default_rng(1)
    v, toks = rng.standard_normal(8).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    new = [(1, {"op": "upsert", "docs": [["x", "", "", {}, {"img": encode_array(v)},
                                          encode_array(toks)]]})]
    old = [(1, {"op": "upsert", "docs": [["x", "", "", {}, {"img": v.tolist()}, toks.tolist()]]})]
    for records in (new, old):
        doc = net_changes(records)[0]["x"]
        assert np.array_equal(doc.vectors["img"], v) and np.array_equal(doc.tokens, toks)
        doc.vectors["img"][0] = 0.0  # writable, whichever form it came from
    # what the writer appends, read back from its WAL file
    eng = polyindex.open(tmp_path / "d", online=True)
    coll = eng.create_collection("v", ["dense@img:dim=8"], model=None)
    coll.add([{"id": "x", "vectors": {"img": v}}])
    wal = sorted((tmp_path / "d" / "v" / "wal").glob("wal-*.log"))
    assert wal and b'"f4"' in wal[-1].read_bytes() and str(float(v[0])).encode() not in \
        wal[-1].read_bytes()
    eng.close()
    again = polyindex.open(tmp_path / "d").collection("v")
    assert np.array_equal(again.get(["x"], with_vectors=True)[0].vectors["img"], v)
