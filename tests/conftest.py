"""Shared test fixtures: synthetic corpora and a runner for the ``polyindex`` CLI."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

# Fixed segmentation for the suite (and the processes it starts): many tests count the
# segments their add() calls made, and the fault campaign counts the failpoints each
# operation passes. The embedded writer's background merging is tested with it turned
# back on (``setting("POLYINDEX_MERGE_EMBEDDED", "1")``, tests/test_embedded_merge.py).
os.environ.setdefault("POLYINDEX_MERGE_EMBEDDED", "0")

from polyindex.service import native_front  # noqa: E402

WORDS = ("alpha beta gamma delta epsilon zeta theta iota kappa lambda omicron sigma river "
         "mountain ocean forest desert city harbor valley glacier canyon meadow island prairie "
         "volcano tundra lagoon marsh plateau").split()


def make_corpus(path: Path, n: int, seed: int, *, dup_frac: float = 0.15,
                words: int = 30) -> list[dict]:
    """Write ``n`` JSONL records to ``path`` and return them in file order.

    Deterministic per seed. After the first sixth of the file, about ``dup_frac`` of the
    records reuse an earlier id (so bulk indexing upserts, across and within segments). Every
    record's text starts with a token unique to that record (``v<line>``), so the version a
    collection holds can be told apart by text and found by a lexical query.
    """
    rng = random.Random(seed)
    records = []
    for i in range(n):
        doc_id = f"d{rng.randrange(i)}" if i > n // 6 and rng.random() < dup_frac else f"d{i}"
        text = f"v{i} " + " ".join(rng.choice(WORDS) for _ in range(words))
        records.append({"_id": doc_id, "title": f"t{i}", "text": text})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def last_versions(records: list[dict]) -> dict[str, dict]:
    """id -> its last record (upsert: last write wins)."""
    return {r["_id"]: r for r in records}


def run_cli(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m polyindex.cli.main ARGS`` to completion (no check on the exit code)."""
    return subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=timeout)


def run_each(runs: list[tuple[list[str], dict]], timeout: float = 300
             ) -> list[subprocess.CompletedProcess]:
    """Run independent child processes (argv, env), one per core at a time, and return their
    results in the order given. A fault campaign's children each write their own folder and
    are checked afterwards, so running two at once changes nothing but the wall time (most of
    a child's time is one core's Python start and imports)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda r: subprocess.run(r[0], env=r[1], capture_output=True,
                                                      text=True, timeout=timeout), runs))


def cli_command(*args) -> list[str]:
    return [sys.executable, "-m", "polyindex.cli.main", *map(str, args)]


@pytest.fixture(scope="session")
def corpus():
    """``corpus.make(path, n, seed, ...)`` and ``corpus.last(records)``."""
    class Corpus:
        make = staticmethod(make_corpus)
        last = staticmethod(last_versions)
    return Corpus


@pytest.fixture(scope="session")
def cli():
    """``cli(*args)`` -> CompletedProcess; ``cli.command(*args)`` -> argv for Popen."""
    class Cli:
        command = staticmethod(cli_command)

        def __call__(self, *args, timeout: float = 600):
            return run_cli(*args, timeout=timeout)
    return Cli()


# Both gRPC front ends serve the same servicer; tests of the service run against each.
NEEDS_NATIVE = pytest.mark.skipif(not native_front.available(),
                                  reason="the native gRPC front end is not built (run `make native`)")
FRONTENDS = [pytest.param("native", marks=NEEDS_NATIVE), "python"]


@pytest.fixture(scope="module", params=FRONTENDS)
def frontend(request) -> str:
    """"native" (gRPC C++) or "python" (grpcio): the front end a test's server uses."""
    return request.param


@pytest.fixture(autouse=True, scope="session")
def _quiet_env():
    # Subprocesses inherit this: no tokenizer fork warnings in the CLI's stderr.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    yield


@pytest.fixture
def eng(tmp_path):
    """An embedded engine over a fresh data directory, closed after the test."""
    import polyindex
    e = polyindex.open(tmp_path / "data")
    yield e
    e.close()


@pytest.fixture
def setting(monkeypatch):
    """``setting(ENV, value)``: change a ``POLYINDEX_*`` setting for this test (settings are
    read once per process: ``config.reload_settings``), restored after it."""
    from polyindex import config

    def change(env: str, value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(env, raising=False)
        else:
            monkeypatch.setenv(env, value)
        config.reload_settings()
    yield change
    monkeypatch.undo()
    config.reload_settings()


def start_server(data, *extra, env: dict | None = None):
    """``polyindex serve --data DATA --port 0 EXTRA...`` in a subprocess, once it says where
    it serves: (the process, its address). Stop it with ``stop_server``."""
    import re
    proc = subprocess.Popen(cli_command("serve", "--data", data, "--port", "0", *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    m = re.search(r"serving on (\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, m.group(1)


def stop_server(proc, timeout: float = 90) -> tuple[int, str]:
    """SIGTERM, then (its exit code, its stderr); killed if it outlives ``timeout``."""
    import signal
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


# -- the suite's budget --------------------------------------------------------------------
# `make test` (both tiers) must finish within 25 minutes on the project's 2-core machine from
# a fresh clone; the `slow` tier (the embedding model, many subprocesses, the fault campaign)
# is what `make test-fast` leaves out. The time each tier took is printed at the end.
BUDGET_S = 25 * 60
_tier_seconds = {"slow": 0.0, "fast": 0.0}


def pytest_runtest_logreport(report):
    tier = "slow" if "slow" in report.keywords else "fast"
    _tier_seconds[tier] += report.duration


def pytest_terminal_summary(terminalreporter):
    fast, slow = _tier_seconds["fast"], _tier_seconds["slow"]
    total = fast + slow
    terminalreporter.write_line(
        f"suite time: fast tier {fast / 60:.1f} min, slow tier {slow / 60:.1f} min, "
        f"{total / 60:.1f} min of the {BUDGET_S // 60} min budget"
        + (" - OVER BUDGET" if total > BUDGET_S else ""))
