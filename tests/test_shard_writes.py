"""A batch spanning shards is atomic per shard, not across them (issue 43 part 2; the
contract is in docs/notes/sharded-serving.md): each shard's part is one WAL record of that
shard, applied whole or not at all; parts other shards acknowledged stay (durable, visible
at once) when one shard fails; the call fails with that shard's error; a retry of the whole
batch completes it (upserts and deletes by id are idempotent).

Two faults at the second shard's write, after the first shard acknowledged its part: a
failpoint error (the call fails, the process lives on), and a kill -9 of the process that
runs the router and its shards (``wal.append.write=crash``), after which the directory is
opened again and recovered.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polyindex.distributed.router import shard_of
from polyindex.distributed.serving import ShardedEngine
from polyindex.errors import StorageFailed
from polyindex.storage import failpoints

KINDS = ["lexical"]
TEXTS = ["wing flutter at transonic speed", "heat transfer in hypersonic flow",
         "laminar boundary layer transition", "shock wave and boundary layer"]


def _batch(prefix: str, n: int) -> list[dict]:
    """``n`` documents whose first belongs to shard 0 (so shard 0's part is sent first)
    and which span both shards."""
    docs = [{"id": f"{prefix}{i}", "text": TEXTS[i % len(TEXTS)] + f" {prefix} {i}"}
            for i in range(n)]
    first = next(i for i, d in enumerate(docs) if shard_of(d["id"], 2) == 0)
    docs.insert(0, docs.pop(first))
    assert {shard_of(d["id"], 2) for d in docs} == {0, 1}
    return docs


def _parts(docs):
    return ([d["id"] for d in docs if shard_of(d["id"], 2) == 0],
            [d["id"] for d in docs if shard_of(d["id"], 2) == 1])


def _present(coll, ids) -> list[bool]:
    return [g is not None for g in coll.get(ids)]


def _engine(path: Path) -> ShardedEngine:
    return ShardedEngine.in_process(path, shards=2, replicas=2)


def test_a_failed_shard_write_keeps_the_other_parts_and_a_retry_completes(tmp_path):
    eng = _engine(tmp_path / "d")
    coll = eng.create_collection("c", KINDS, model=None)
    coll.add(_batch("base", 10))
    batch = _batch("new", 24)
    on0, on1 = _parts(batch)
    with failpoints.armed("wal.append.write", "error", nth=2):  # shard 1's append
        with pytest.raises(StorageFailed):  # as one node raises it (UNAVAILABLE)
            coll.add(batch)
    coll.catch_up()
    assert all(_present(coll, on0)) and not any(_present(coll, on1))
    assert coll.count() == 10 + len(on0)
    hits = coll.query("new transonic", k=50, profile="lexical")
    assert {h.id for h in hits} & set(on0) and not {h.id for h in hits} & set(on1)
    eng.close()

    eng = _engine(tmp_path / "d")  # recovery: the same outcome, then the retry completes it
    coll = eng.collection("c")
    assert all(_present(coll, on0)) and not any(_present(coll, on1))
    coll.add(batch)
    coll.catch_up()
    assert coll.count() == 10 + len(batch) and all(_present(coll, on0 + on1))
    # a delete spanning shards: the same contract
    with failpoints.armed("wal.append.write", "error", nth=2):
        with pytest.raises(StorageFailed):  # as one node raises it (UNAVAILABLE)
            coll.delete([on0[0], on1[0]])
    coll.catch_up()
    assert _present(coll, [on0[0], on1[0]]) == [False, True]
    assert coll.delete([on0[0], on1[0]]) == 1
    eng.close()


def test_a_process_killed_mid_batch_recovers_per_shard(tmp_path):
    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "d"
    eng = _engine(data)
    eng.create_collection("c", KINDS, model=None).add(_batch("base", 10))
    eng.close()
    batch = _batch("new", 24)
    on0, on1 = _parts(batch)
    script = textwrap.dedent(f"""
        from polyindex.distributed.serving import ShardedEngine
        from polyindex.storage import failpoints
        eng = ShardedEngine.in_process({str(data)!r}, shards=2, replicas=2)
        coll = eng.collection("c")
        failpoints.arm("wal.append.write", "crash", nth=2)  # kill -9 at shard 1's append
        coll.add({batch!r})
        print("not killed")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    eng = _engine(data)
    coll = eng.collection("c")
    assert all(_present(coll, on0)) and not any(_present(coll, on1))
    assert coll.count() == 10 + len(on0)
    coll.add(batch)  # the retry the client makes after its call failed
    coll.catch_up()
    assert coll.count() == 10 + len(batch)
    eng.close()
    from polyindex.storage.verify import verify_collection
    for s in range(2):  # each shard's directory reads back whole (``polyindex verify``)
        report = verify_collection(data / f"shard-{s:03d}" / "c")
        assert report.ok, report.to_json()
