"""Crash safety of online writes: kill -9 the server while a client streams upserts.

After a restart, every acknowledged id is there with its latest acknowledged content, and the
one batch in flight at the kill is all or nothing (its record was fsynced whole or not at all).
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import NEEDS_NATIVE

from polyindex.client.remote import Client

RUNS = 10  # on the native front end (the default), plus a few on grpcio's
CASES = ([pytest.param("native", seed, marks=NEEDS_NATIVE) for seed in range(RUNS)]
         + [("python", seed) for seed in range(3)])


def start(data, env, frontend):
    proc = subprocess.Popen([sys.executable, "-m", "polyindex.cli.main", "serve", "--data", str(data),
                             "--port", "0", "--frontend", frontend], stdout=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    m = re.search(r"serving on (\S+)", line)
    assert m, f"server did not start: {line!r}"
    return proc, m.group(1)


@pytest.mark.parametrize("frontend,seed", CASES)
def test_kill_server_during_upserts(tmp_path, frontend, seed):
    rng = random.Random(seed)
    # Seal often so kills also land during sealing and WAL rotation.
    env = {**os.environ, "POLYINDEX_SEAL_DOCS": str(rng.choice([20, 60, 200])),
           "POLYINDEX_SEAL_SECONDS": str(rng.choice([0.3, 1.0, 30.0]))}
    proc, address = start(tmp_path, env, frontend)
    client = Client(address, timeout=10)
    coll = client.create_collection("c", ["lexical"])
    acked: dict[str, str] = {}
    inflight: dict[str, str] = {}
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            batch = {f"d{n + i}": f"first version {n + i}" for i in range(rng.randint(1, 8))}
            n += len(batch)
            for old in rng.sample(sorted(acked), min(len(acked), rng.randint(0, 3))):
                batch[old] = f"rewritten {old} at {n}"
            inflight.clear()
            inflight.update(batch)
            try:
                coll.add([{"id": i, "text": t} for i, t in batch.items()])
            except Exception:  # noqa: BLE001 - the kill: this batch was never acknowledged
                return
            acked.update(batch)
            inflight.clear()

    t = threading.Thread(target=writer)
    t.start()
    # the kill lands a random time after the first acknowledgement (a busy machine can take
    # longer than the shortest random wait to acknowledge the server's first write)
    deadline = time.monotonic() + 60
    while not acked and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.3, 2.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stop.set()
    t.join()
    client.close()
    assert acked, "nothing was acknowledged before the kill; lengthen the run"

    proc, address = start(tmp_path, env, frontend)
    try:
        with Client(address, timeout=30) as again:
            c = again.collection("c")
            ids = sorted(acked.keys() | inflight.keys())
            got = dict(zip(ids, c.get(ids)))
            pending_seen = [i for i, t in inflight.items() if got[i] is not None and got[i].text == t]
            assert pending_seen in ([], list(inflight)), "an unacknowledged batch is half-visible"
            for doc_id, text in acked.items():
                doc = got[doc_id]
                assert doc is not None, f"acknowledged id {doc_id} lost"
                if doc_id in pending_seen:
                    assert doc.text == inflight[doc_id]
                else:
                    assert doc.text == text, f"{doc_id}: {doc.text!r} is not the latest acknowledged"
            expected = len(acked.keys() | (inflight.keys() if pending_seen else set()))
            assert c.count() == expected
            assert {h.id for h in c.query("first version", profile="lexical", k=10_000)} <= set(ids)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
