"""The workload of the failpoint campaign, and the check that a reopened collection holds a
prefix of what was acknowledged.

Every operation the workload completes is *acknowledged*: it is appended to the ack log
(a list in-process, a line on stdout in a subprocess, flushed before the next operation).
The check replays the acknowledged operations on a model (id -> text) and compares. An
operation that raised must have had no effect; the one in flight at a crash may have
happened entirely or not at all, never in part.

Run as a script (``python tests/fault_workload.py DIR``) it prints one JSON line per
acknowledged operation; arm a crash point with POLYINDEX_FAILPOINTS to kill it mid-way.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import polyindex


def operations():
    """(kind, payload) of each step: upserts (new ids, and new versions of d0-0), deletes,
    seals, and a drop and re-create of a second collection."""
    plan = ["upsert", "upsert", "upsert", "delete", "seal", "upsert", "drop_create", "delete",
            "upsert", "seal", "drop_create", "upsert", "delete", "upsert", "seal", "delete",
            "drop_create", "upsert"]
    for step, kind in enumerate(plan):
        if kind == "upsert":
            yield kind, [{"id": f"d{step}-{i}", "text": f"alpha v{step} {i}"} for i in range(3)] \
                + [{"id": "d0-0", "text": f"alpha v{step} latest"}]
        elif kind == "delete":
            yield kind, [f"d{step - 3}-0", f"d{step - 2}-1"]
        elif kind == "drop_create":
            yield kind, "other"
        else:
            yield kind, None


def run(path: Path, ack, *, seal_docs: int = 10**9) -> None:
    """Run the workload on ``path``; ``ack(op)`` after each operation that returned. Errors
    are swallowed after being recorded (``ack`` is not called for them): the workload goes on,
    as a client would retry with the next request. It seals only where it says (and at
    close): a size-triggered seal would come when the sealer thread looks, and move the
    hits after it from run to run."""
    eng = polyindex.open(path, online=True)
    try:
        for _attempt in range(3):  # a failed create is retried, as a client would
            try:
                coll = eng.create_collection("c", ["lexical"], exist_ok=True)
                break
            except (OSError, polyindex.PolyindexError):
                continue
        coll.live.writes.seal_docs, coll.live.writes.seal_seconds = seal_docs, 1e9
        for kind, payload in operations():
            try:
                if kind == "upsert":
                    eng.collection("c").add(payload)
                elif kind == "delete":
                    eng.collection("c").delete(payload)
                elif kind == "seal":
                    eng.collection("c").seal()
                elif kind == "drop_create":
                    if payload in eng.list_collections():
                        eng.drop_collection(payload)
                    eng.create_collection(payload, ["lexical"]).add(
                        [{"id": "o1", "text": "alpha other"}])
            except (OSError, polyindex.PolyindexError):
                continue
            ack((kind, payload))
    finally:
        try:
            eng.close()
        except (OSError, polyindex.PolyindexError):
            pass  # a close that could not seal: the WAL keeps the writes


def model(acked) -> dict[str, str]:
    state: dict[str, str] = {}
    for kind, payload in acked:
        if kind == "upsert":
            for d in payload:
                state[d["id"]] = d["text"]
        elif kind == "delete":
            for i in payload:
                state.pop(i, None)
    return state


def stored(path: Path) -> dict[str, str]:
    with polyindex.open(path, online=True) as eng:
        if "c" not in eng.list_collections():  # a crash inside the very first create
            return {}
        coll = eng.collection("c")
        hits = coll.query("alpha", profile="lexical", k=10_000)
        docs = coll.get([h.id for h in hits])
        assert coll.count() == len(hits), (coll.count(), len(hits))
        return {d.id: d.text for d in docs}


def check(path: Path, acked, in_flight=None) -> None:
    """The reopened collection equals the acknowledged operations, plus the operation in
    flight at a crash applied entirely or not at all; then every file verifies."""
    got = stored(path)
    from polyindex.storage.verify import verify_data
    reports = verify_data(path)
    assert all(r.ok for r in reports), [r.to_json() for r in reports]
    allowed = [model(acked)]
    if in_flight is not None:
        allowed.append(model(list(acked) + [in_flight]))
    assert got in allowed, _diff(got, allowed[0])


def _diff(got, want) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(i for i in set(got) & set(want) if got[i] != want[i])
    return f"missing {missing[:5]}, unacknowledged {extra[:5]}, wrong content {wrong[:5]}"


if __name__ == "__main__":
    def _print(op):
        print(json.dumps(op), flush=True)

    run(Path(sys.argv[1]), _print)
