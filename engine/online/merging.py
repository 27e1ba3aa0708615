"""Background merging of a writer's segments: a served (``online=True``) collection's and an
embedded writer's (``polyindex.open(path)``, ``add()`` committing a segment per call).

One thread per collection asks the merge policy (``storage.merge_policy``) for a merge after
every write (a seal, an embedded commit), every ``INTERVAL_S``, and once the writer has been
quiet for ``POLYINDEX_MERGE_IDLE`` seconds (the policy's ``idle`` plan: the smallest tier
into one segment), and runs it (``storage.compaction.merge``: built in the build process
beside queries and writes, committed under the writer). Queries never wait on it: they keep
the snapshot they hold, and the merger opens the merged snapshot before they see it. A
failed merge is logged, counted and retried after a backoff; it never touches acknowledged
data (the sources stay until a commit replaces them), and a crash mid-merge leaves the old
manifest. ``stop`` is bounded: an unfinished build is killed, nothing of it committed.
``POLYINDEX_MERGE=0`` turns background merging off, ``POLYINDEX_MERGE_EMBEDDED=0`` only an
embedded writer's (``compact`` still works).
"""
from __future__ import annotations

import logging
import threading
import time

from polyindex.config import settings
from polyindex.errors import NotFound
from polyindex.storage import compaction
from polyindex.storage.merge import Cancelled
from polyindex.storage.merge_policy import TieredPolicy

INTERVAL_S = 5.0
BACKOFF_S = (1.0, 60.0)
log = logging.getLogger("polyindex.online")


class BackgroundMerger:
    def __init__(self, table, online, policy: TieredPolicy, idle_s: float | None = None):
        self.table = table
        self.online = online  # the online writer (a merge commits under its seal lock), or None
        self.policy = policy
        self.idle_s = settings().merge_idle if idle_s is None else idle_s
        self._last_write = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failures = 0
        self._merging = False
        self._thread = threading.Thread(target=self._run, name=f"merge-{table.name}",
                                        daemon=True)

    @classmethod
    def start_for(cls, table, online) -> "BackgroundMerger | None":
        """The merger of an online writer (``online``) or, with ``online=None``, of an
        embedded one; None when the settings turn it off."""
        s = settings()
        if not s.merge or (online is None and not s.merge_embedded):
            return None
        merger = cls(table, online, TieredPolicy.from_settings())
        if online is not None:
            online.on_sealed = merger.wake
        merger._thread.start()
        return merger

    def wake(self) -> None:
        """A write committed segments: plan now, and count the quiet time from here."""
        self._last_write = time.monotonic()
        self._wake.set()

    def busy(self) -> bool:
        """A merge is running, or the policy would start one once the writer is quiet."""
        if self._merging:
            return True
        return self.policy.plan(self.table.sealed_snapshot().manifest.segments,
                                idle=True) is not None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        wait = 0.0  # a collection opened with segments the policy would merge: at once
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            wait = INTERVAL_S
            try:
                segments = self.table.sealed_snapshot().manifest.segments
                quiet = time.monotonic() - self._last_write
                plan = self.policy.plan(segments, idle=quiet >= self.idle_s)
                if plan is None:
                    self.table.collect_garbage()  # files a query in flight pinned at the merge
                    if quiet < self.idle_s and self.policy.plan(segments, idle=True):
                        wait = self.idle_s - quiet  # back when the writer has been quiet
                    continue
                self._merging = True
                try:
                    compaction.merge(self.table, plan, self._stop.is_set, self.online,
                                     remote=True)
                finally:
                    self._merging = False
                self._failures = 0
                wait = 0.0  # the policy may want another merge right away
            except (Cancelled, NotFound):
                continue
            except Exception as e:  # noqa: BLE001 - logged, counted, retried
                if self._stop.is_set():
                    return  # closing: the build was stopped under it
                self._failures += 1
                wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self._failures - 1))
                self.table.merge_stats["last_merge_error"] = f"{type(e).__name__}: {e}"
                log.error("%s: merge failed (attempt %d, retry in %.0f s): %s", self.table.name,
                          self._failures, wait, e)
