"""Prometheus metrics of one server, in its own registry (several servers can share a process).

Request counts by RPC and status code, latency by RPC and rank profile, and per-collection
gauges (documents, segments, deleted rows, WAL bytes) read from ``collection.info()`` at
scrape time, so they are never stale and cost nothing between scrapes.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter as _Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("polyindex.service.server")
LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
_GAUGES = (("documents", "Live documents"), ("segments", "Sealed segments"),
           ("deleted_rows", "Tombstoned rows not yet compacted away"),
           ("wal_bytes", "Bytes in the write-ahead log not yet sealed into segments"),
           ("buffered_docs", "Acknowledged documents not yet sealed into a segment"),
           ("seal_failures", "Consecutive failed seals of the write buffer (0: healthy)"),
           ("bytes_on_disk", "Bytes of the segments and tombstones on disk (and garbage)"),
           ("bytes_reclaimable", "Bytes a compaction would reclaim (deleted rows, garbage)"),
           ("merges", "Segment merges made by this server"),
           ("merge_failures", "Segment merges that failed in this server"))


class CollectionCollector:
    """Per-collection gauges, computed when Prometheus scrapes."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        families = {key: GaugeMetricFamily(f"polyindex_collection_{key}", help_, labels=["collection"])
                    for key, help_ in _GAUGES}
        for name in self.engine.list_collections():
            try:
                info = self.engine.collection(name).info()
            except Exception:  # noqa: BLE001 - dropped meanwhile, or unreadable: skip it
                log.debug("metrics: cannot read collection %s", name, exc_info=True)
                continue
            for key, fam in families.items():
                fam.add_metric([name], float(info.get(key) or 0))
        yield from families.values()

    def describe(self):
        return []  # dynamic: do not collect at registration time


class Metrics:
    def __init__(self, engine, member=None):
        self.registry = CollectorRegistry()
        self.started = time.time()
        # Which process this is (``serve --processes N`` labels each worker's series with it)
        role = member.role if member is not None else ("readonly" if engine.readonly else "writer")
        Gauge("polyindex_process", "This server process (always 1): its pid, role and worker",
              ["pid", "role", "worker"], registry=self.registry).labels(
                  str(os.getpid()), role, str(member.worker if member is not None else 0)).set(1)
        self.requests = Counter("polyindex_requests", "RPCs by method and status code",
                                ["rpc", "code"], registry=self.registry)
        self.latency = Histogram("polyindex_request_seconds", "RPC latency by method and profile",
                                 ["rpc", "profile"], buckets=LATENCY_BUCKETS, registry=self.registry)
        Gauge("polyindex_uptime_seconds", "Seconds since the server started",
              registry=self.registry).set_function(lambda: time.time() - self.started)
        self.registry.register(CollectionCollector(engine))
        self._tally: _Tally[str] = _Tally()
        self._children: dict[tuple[str, str, str], tuple] = {}
        self._lock = threading.Lock()
        self._http = None

    def observe(self, rpc: str, code: str, seconds: float, profile: str = "",
                tally: bool = True) -> None:
        """Record a call; ``tally=False``: not in ``counts()`` (Stats' requests), which count
        the calls of clients (a group's internal calls are counted where they arrived)."""
        # labels() validates and looks up the child on every call: keep the children
        key = (rpc, code, profile)
        children = self._children.get(key)
        if children is None:
            children = self._children.setdefault(
                key, (self.requests.labels(rpc, code), self.latency.labels(rpc, profile)))
        children[0].inc()
        children[1].observe(seconds)
        if tally:
            with self._lock:
                self._tally[rpc] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._tally)

    def query_latency(self) -> tuple[float, float]:
        """(count, seconds) of every Query call so far, over all profiles (the console's
        latency chart takes differences of two samples)."""
        count = total = 0.0
        for metric in self.latency.collect():
            for s in metric.samples:
                if s.labels.get("rpc") != "Query":
                    continue
                if s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
        return count, total

    def uptime(self) -> float:
        return time.time() - self.started

    def start_http(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on host:port (loopback by default); returns the bound port."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._http.server_port

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
