"""The follower workload of the failpoint campaign: a writer (this process) runs rounds of
upserts, deletes, seals and a compaction; after each round a read-only follower must
answer exactly the writes acknowledged so far. A read error injected into the follower
(its WAL tail, its manifest re-read, its segment opens) may fail that query; the retry must
answer the acknowledged state again: consistent, caught up, nothing lost.

Deterministic when ``follow.RECHECK_S`` is 0 (every query catches up once) and the writer
seals only when told (no size or age seals, no background merging)."""
from __future__ import annotations

from pathlib import Path

import polyindex

ROUNDS = [["upsert"], ["upsert", "delete"], ["seal", "upsert"], ["delete", "upsert"],
          ["seal", "upsert", "delete"], ["compact", "upsert"], ["seal"], ["upsert", "delete"]]


def _docs(r: int, k: int) -> list[dict]:
    return [{"id": f"f{r}-{k}-{i}", "text": f"alpha r{r} {i}"} for i in range(3)] \
        + [{"id": "f0-0-0", "text": f"alpha latest r{r} {k}"}]


def run(path: Path, failures: list) -> int:
    """Run the rounds; after each, the follower's answer (retried once after an error,
    which is appended to ``failures``) must be the acknowledged state. Returns the
    number of rounds checked."""
    state: dict[str, str] = {}
    checked = 0
    with polyindex.open(path, online=True) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None)
        coll.live.writes.seal_docs, coll.live.writes.seal_seconds = 10**9, 1e9
        reader = polyindex.open(path, readonly=True)
        follower = None

        def look() -> dict[str, str]:
            nonlocal follower  # opened by the first look: its manifest read is a fault site
            if follower is None:
                follower = reader.collection("c")
            return answer(follower)
        try:
            for r, ops in enumerate(ROUNDS):
                for k, op in enumerate(ops):
                    if op == "upsert":
                        docs = _docs(r, k)
                        coll.add(docs)
                        state.update({d["id"]: d["text"] for d in docs})
                    elif op == "delete":
                        gone = sorted(state)[::3][:3]
                        coll.delete(gone)
                        for g in gone:
                            state.pop(g)
                    elif op == "seal":
                        coll.seal()
                    else:
                        coll.compact()
                try:
                    got = look()
                except (OSError, polyindex.PolyindexError) as e:
                    failures.append((r, e))
                    got = look()  # the fault is spent: this one must catch up
                assert got == state, (r, _diff(got, state))
                checked += 1
        finally:
            reader.close()
    return checked


def answer(coll) -> dict[str, str]:
    hits = coll.query("alpha", profile="lexical", k=10_000)
    docs = coll.get([h.id for h in hits])
    assert coll.count() == len(hits), (coll.count(), len(hits))
    return {d.id: d.text for d in docs}


def _diff(got: dict, want: dict) -> str:
    return (f"missing {sorted(set(want) - set(got))[:5]}, "
            f"extra {sorted(set(got) - set(want))[:5]}, "
            f"stale {sorted(i for i in set(got) & set(want) if got[i] != want[i])[:5]}")
