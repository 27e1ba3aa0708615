"""Crash campaign: kill -9 the server under 4 streaming writers, and kill -9 bulk indexing.

Part 1 (``--server-runs``, default 100): a server (lexical collection, seals every 20-200
documents or 0.3-1 s, background merges of every 2, 3 or 8 segments, so kills land during
appends, seals, WAL rotation and merges) gets four
client threads streaming upserts (new ids and rewrites of acknowledged ones) and deletes;
after a random 0.3-2.5 s it is killed with SIGKILL and restarted. The script's own
bookkeeping then checks: every acknowledged upsert present with its latest acknowledged
content, every acknowledged delete gone, each batch in flight at the kill all or nothing.

Part 2 (``--bulk-runs``, default 20): ``polyindex index`` of a generated JSONL corpus (small
segments) is killed at a random moment and run again to completion; the collection must
equal the corpus (last write wins), whatever the kill interrupted.

Prints a table, writes bench/results/bench_crash.json. Everything binds to 127.0.0.1.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from common import start_serving  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
console = Console()


def start(data: Path, env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    with open(log, "a") as err:  # the server's stderr (its log), kept as evidence on a loss
        return start_serving(["--data", data, "--port", 0], env=env, stderr=err)


class Writer(threading.Thread):
    """One streaming client: acknowledged state per id (text, or None for deleted)."""

    def __init__(self, coll, wid: int, rng: random.Random, stop: threading.Event):
        super().__init__(daemon=True)
        self.coll, self.wid, self.rng, self.stop = coll, wid, rng, stop
        self.acked: dict[str, str | None] = {}
        self.inflight: dict[str, str | None] = {}
        self.ops = 0
        self.error: str | None = None     # why the writer stopped (expected: the kill)
        self.stopped_at: float | None = None

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            live = [i for i, t in self.acked.items() if t is not None]
            if live and self.rng.random() < 0.15:
                ids = self.rng.sample(live, min(len(live), self.rng.randint(1, 3)))
                self.inflight = dict.fromkeys(ids)
                call = lambda: self.coll.delete(ids)  # noqa: E731
            else:
                batch = {f"w{self.wid}-{n + i}": f"alpha v{n} {self.wid}-{n + i}"
                         for i in range(self.rng.randint(1, 8))}
                n += len(batch)
                for old in self.rng.sample(live, min(len(live), self.rng.randint(0, 2))):
                    batch[old] = f"alpha rewritten {old} at {n}"
                self.inflight = batch
                call = lambda: self.coll.add([{"id": i, "text": t}  # noqa: E731
                                              for i, t in batch.items()])
            try:
                call()
            except Exception as e:  # noqa: BLE001 - the kill: this operation was never acknowledged
                self.error, self.stopped_at = f"{type(e).__name__}: {e}"[:300], time.monotonic()
                return
            self.acked.update(self.inflight)
            self.inflight = {}
            self.ops += 1


def check_writer(w: Writer, got: dict) -> str | None:
    """None if the restarted server holds w's acknowledged state (in-flight: all or nothing)."""
    def matches(state: dict) -> bool:
        return all((got.get(i).text if got.get(i) is not None else None) == t
                   for i, t in state.items())
    if w.inflight and matches({**w.acked, **w.inflight}):  # all of the batch
        return None
    # none of it: the in-flight ids keep their acknowledged state (absent if never acknowledged);
    # checking only w.acked here let a batch that landed in part pass
    if matches({**{i: w.acked.get(i) for i in w.inflight}, **w.acked}):
        return None
    bad = [i for i, t in w.acked.items()
           if i not in w.inflight and (got.get(i).text if got.get(i) else None) != t]
    if not bad:  # the acknowledged state holds, but the in-flight batch landed in part
        part = {i: (t, got.get(i).text if got.get(i) else None) for i, t in w.inflight.items()}
        return f"writer {w.wid}: in-flight batch applied in part (id: (sent, found)): {part}"
    detail = {i: (w.acked[i], got.get(i).text if got.get(i) else None) for i in bad[:5]}
    return (f"writer {w.wid}: {len(bad)} acknowledged ids wrong or lost "
            f"(id: (acknowledged, found)): {detail}")


def server_run(seed: int, workdir: Path) -> dict:
    from polyindex.client.remote import Client
    rng = random.Random(seed)
    data = workdir / f"server-{seed}"
    log = workdir / f"server-{seed}.log"
    env = {**os.environ, "POLYINDEX_SEAL_DOCS": str(rng.choice([20, 60, 200])),
           "POLYINDEX_SEAL_SECONDS": str(rng.choice([0.3, 1.0])),
           # background merges of every few segments, so kills land in merges too
           "POLYINDEX_MERGE_FACTOR": str(rng.choice([2, 3, 8]))}
    proc, address = start(data, env, log)
    client = Client(address, timeout=10)
    client.create_collection("c", ["lexical"])
    stop = threading.Event()
    writers = [Writer(client.collection("c"), w, random.Random(seed * 10 + w), stop)
               for w in range(4)]
    for w in writers:
        w.start()
    time.sleep(rng.uniform(0.3, 2.5))
    proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait()
    segments = data / "c" / "segments"
    merging = sum(p.name.startswith(".merge-") for p in segments.iterdir()) \
        if segments.is_dir() else 0  # a merge was being built at the kill
    stop.set()
    for w in writers:
        w.join(timeout=30)
    client.close()
    # a writer that stopped before the kill stopped on an error of its own: report it
    early = [f"writer {w.wid} stopped {killed_at - w.stopped_at:.2f} s before the kill: {w.error}"
             for w in writers if w.stopped_at is not None and w.stopped_at < killed_at]
    proc, address = start(data, env, log)
    errors = []
    try:
        with Client(address, timeout=30) as again:
            c = again.collection("c")
            ids = sorted({i for w in writers for i in (*w.acked, *w.inflight)})
            got = dict(zip(ids, c.get(ids))) if ids else {}
            errors = [e for w in writers if (e := check_writer(w, got))]
            live = {i for i, d in got.items() if d is not None}
            if c.count() != len(live):
                errors.append(f"count {c.count()} != {len(live)} live acknowledged ids")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if errors:  # keep the data directory, the server log and the bookkeeping
        keep = RESULTS / "crash-evidence" / f"server-{seed}"
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
        shutil.copytree(data, keep / "data")
        shutil.copy(log, keep / "server.log")
        (keep / "writers.json").write_text(json.dumps(
            [{"wid": w.wid, "acked": w.acked, "inflight": w.inflight, "error": w.error}
             for w in writers], indent=1))
    shutil.rmtree(data, ignore_errors=True)
    log.unlink(missing_ok=True)
    return {"seed": seed, "seal_docs": env["POLYINDEX_SEAL_DOCS"],
            "seal_seconds": env["POLYINDEX_SEAL_SECONDS"],
            "merge_factor": env["POLYINDEX_MERGE_FACTOR"], "killed_in_merge_build": merging,
            "acked_ops": sum(w.ops for w in writers),
            "acked_ids": sum(len(w.acked) for w in writers),
            "inflight_ids": sum(len(w.inflight) for w in writers),
            "writer_errors_before_kill": early, "errors": errors}


def bulk_run(seed: int, workdir: Path, corpus: Path, expected: dict[str, str],
             n_segments: int) -> dict:
    rng = random.Random(1000 + seed)
    data = workdir / f"bulk-{seed}"
    cmd = [sys.executable, "-m", "polyindex.cli.main", "index", str(corpus), "--data",
           str(data), "--collection", "c", "--index", "lexical", "--segment-size", "300",
           "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Kill while it indexes: once a random number of segment folders (0..all) exist, after a
    # random extra 0-80 ms (a fixed 1-4 s sleep mostly hit the ~1.3 s interpreter start-up
    # or a run that had already finished: the whole run takes ~2.7 s here).
    segments = data / "c" / "segments"
    target = rng.randint(0, n_segments)
    while proc.poll() is None and \
            (len(os.listdir(segments)) if segments.is_dir() else -1) < target:
        time.sleep(0.002)
    time.sleep(rng.uniform(0.0, 0.08))
    killed = proc.poll() is None
    at_kill = len(os.listdir(segments)) if segments.is_dir() else 0
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=600)
    errors = [] if again.returncode == 0 else [f"rerun failed: {again.stderr[-500:]}"]
    if not errors:
        import polyindex
        with polyindex.open(data, readonly=True) as eng:
            coll = eng.collection("c")
            docs = coll.get(list(expected))
            wrong = [i for i, d in zip(expected, docs) if d is None or d.text != expected[i]]
            if wrong:
                errors.append(f"{len(wrong)} documents lost or stale, e.g. {wrong[:3]}")
            if coll.count() != len(expected):
                errors.append(f"count {coll.count()} != {len(expected)}")
    if errors:
        keep = RESULTS / "crash-evidence" / f"bulk-{seed}"
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(data, keep / "data")
        (keep / "rerun.txt").write_text(again.stdout + "\n--- stderr ---\n" + again.stderr)
    shutil.rmtree(data, ignore_errors=True)
    return {"seed": seed, "killed_mid_run": killed, "segment_folders_at_kill": at_kill,
            "errors": errors}


def make_corpus(path: Path, n: int) -> dict[str, str]:
    rng = random.Random(7)
    expected = {}
    with open(path, "w") as f:
        for i in range(n):
            doc_id = f"d{rng.randrange(n * 3 // 4)}"  # duplicates: last write wins
            text = f"alpha document {i} " + " ".join(rng.choice("abcdefghij") * 3
                                                      for _ in range(20))
            expected[doc_id] = text
            f.write(json.dumps({"_id": doc_id, "text": text}) + "\n")
    return expected


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-runs", type=int, default=100)
    ap.add_argument("--bulk-runs", type=int, default=20)
    ap.add_argument("--bulk-docs", type=int, default=6000)
    args = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    workdir = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    results = {"server": [], "bulk": []}
    t0, load0 = time.monotonic(), os.getloadavg()
    try:
        for seed in range(args.server_runs):
            r = server_run(seed, workdir)
            results["server"].append(r)
            eta = (time.monotonic() - t0) / (seed + 1) * (args.server_runs - seed - 1)
            console.print(f"server run {seed + 1}/{args.server_runs}: {r['acked_ops']} acked ops "
                          f"({r['acked_ids']} ids, {r['inflight_ids']} in flight), "
                          f"{'OK' if not r['errors'] else r['errors']}  (ETA {eta:.0f} s)")
            for note in r["writer_errors_before_kill"]:
                console.print(f"  note: {note}")
        corpus = workdir / "corpus.jsonl"
        expected = make_corpus(corpus, args.bulk_docs)
        for seed in range(args.bulk_runs):
            r = bulk_run(seed, workdir, corpus, expected, -(-args.bulk_docs // 300))
            results["bulk"].append(r)
            console.print(f"bulk run {seed + 1}/{args.bulk_runs}: killed mid-run "
                          f"{r['killed_mid_run']} ({r['segment_folders_at_kill']} segment "
                          f"folders), {'OK' if not r['errors'] else r['errors']}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    s, b = results["server"], results["bulk"]
    summary = {
        "server_runs": len(s), "server_acked_ops": sum(r["acked_ops"] for r in s),
        "server_acked_ids_checked": sum(r["acked_ids"] for r in s),
        "server_inflight_ids_checked": sum(r["inflight_ids"] for r in s),
        "server_runs_with_loss": sum(bool(r["errors"]) for r in s),
        "server_writers_stopped_before_kill": sum(len(r["writer_errors_before_kill"]) for r in s),
        "server_killed_in_merge_build": sum(bool(r.get("killed_in_merge_build")) for r in s),
        "bulk_runs": len(b), "bulk_killed_mid_run": sum(r["killed_mid_run"] for r in b),
        "bulk_runs_with_loss": sum(bool(r["errors"]) for r in b),
        "seconds": round(time.monotonic() - t0, 1),
        "loadavg_start": load0, "loadavg_end": os.getloadavg(), "command": sys.argv}
    table = Table(title="crash campaign (kill -9)")
    for col in ("part", "runs", "acknowledged ops / killed mid-run", "runs losing data"):
        table.add_column(col)
    table.add_row("server, 4 streaming writers", str(summary["server_runs"]),
                  f"{summary['server_acked_ops']:,} ops ({summary['server_killed_in_merge_build']}"
                  " killed while a merge was built)", str(summary["server_runs_with_loss"]))
    table.add_row("bulk index", str(summary["bulk_runs"]), str(summary["bulk_killed_mid_run"]),
                  str(summary["bulk_runs_with_loss"]))
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_crash.json").write_text(json.dumps({"summary": summary, **results},
                                                         indent=1))
    sys.exit(1 if summary["server_runs_with_loss"] or summary["bulk_runs_with_loss"] else 0)


if __name__ == "__main__":
    main()
