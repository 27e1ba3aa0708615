"""Background merging of an online collection's segments (the server's, ``online=True``).

One thread per collection asks the merge policy (``storage.merge_policy``) for a merge after
every seal and every ``INTERVAL_S``, and runs it (``storage.compaction.merge``: built beside
queries and writes, committed under the writer). A failed merge is logged, counted and
retried after a backoff; it never touches acknowledged data (the sources stay until a commit
replaces them). ``POLYINDEX_MERGE=0`` turns background merging off (``compact`` still works).
"""
from __future__ import annotations

import logging
import threading

from polyindex.config import settings
from polyindex.errors import NotFound
from polyindex.storage import compaction
from polyindex.storage.merge import Cancelled
from polyindex.storage.merge_policy import TieredPolicy

INTERVAL_S = 5.0
BACKOFF_S = (1.0, 60.0)
log = logging.getLogger("polyindex.online")


class BackgroundMerger:
    def __init__(self, table, online, policy: TieredPolicy):
        self.table = table
        self.online = online  # the online writer: a merge commits under its seal lock
        self.policy = policy
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name=f"merge-{table.name}",
                                        daemon=True)

    @classmethod
    def start_for(cls, table, online) -> "BackgroundMerger | None":
        if not settings().merge:
            return None
        merger = cls(table, online, TieredPolicy.from_settings())
        online.on_sealed = merger.wake
        merger._thread.start()
        return merger

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        wait = INTERVAL_S
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            wait = INTERVAL_S
            try:
                plan = self.policy.plan(self.table.sealed_snapshot().manifest.segments)
                if plan is None:
                    self.table.collect_garbage()  # files a query in flight pinned at the merge
                    continue
                compaction.merge(self.table, plan, self._stop.is_set, self.online)
                self._failures = 0
                wait = 0.0  # the policy may want another merge right away
            except (Cancelled, NotFound):
                continue
            except Exception as e:  # noqa: BLE001 - logged, counted, retried
                self._failures += 1
                wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self._failures - 1))
                self.table.merge_stats["last_merge_error"] = f"{type(e).__name__}: {e}"
                log.error("%s: merge failed (attempt %d, retry in %.0f s): %s", self.table.name,
                          self._failures, wait, e)
