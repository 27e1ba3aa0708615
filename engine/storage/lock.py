"""One writer per data directory: an exclusive ``flock`` on ``DATA/.lock`` held for the
writer's lifetime (server, embedded engine, bulk CLI alike).

The kernel drops the lock when the process dies, kill -9 included, so a crash never leaves a
stale lock. The file names its holder (pid and command line) so that a refused second writer
can say who holds the directory. Readers take no lock (``polyindex.open(path, readonly=True)``).
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from polyindex.errors import FailedPrecondition

LOCK_FILE = ".lock"


def holder(path: Path) -> dict:
    try:
        return json.loads((path / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return {}


class DirectoryLock:
    def __init__(self, path: Path):
        self.path = path
        # A file object, not a bare fd: if the owner is garbage-collected without close(),
        # the file's finalizer still releases the lock.
        self._file = open(path / LOCK_FILE, "a+")  # noqa: SIM115 - held for the lifetime
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            who = holder(path)
            by = (f" by process {who['pid']} ({who.get('command', '?')})" if who.get("pid")
                  else "")
            raise FailedPrecondition(
                f"data directory {path} is already open for writing{by}: one writer per data "
                f"directory. Stop that process, send writes through it (e.g. `polyindex index "
                f"SRC --server HOST:PORT --collection NAME` for a server), or open this one "
                f"read-only (`polyindex.open(path, readonly=True)`, `polyindex serve "
                f"--readonly`)") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv)[:200],
                                     "since": time.time()}))
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            self._file.close()  # closing the only descriptor releases the flock
