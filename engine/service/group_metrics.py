"""The ``--metrics-port`` of ``polyindex serve --processes N``, served by the parent.

At each scrape the parent reads every worker's own /metrics (each worker serves its registry
on a private loopback port, ``metrics_port=0``) with ``prometheus_client``'s parser, and
exposes every series once per worker with ``worker``, ``role`` and ``pid`` labels (the per
process view), plus ``polyindex_group_requests_total`` (requests by RPC and code summed over
the workers that answered), ``polyindex_group_worker_up`` and
``polyindex_group_worker_restarts`` (the aggregate and health view).
"""
from __future__ import annotations

import logging
import urllib.request
from collections import defaultdict

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 2.0
log = logging.getLogger("polyindex.service.server")


def scrape(port: int) -> list[Metric]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=SCRAPE_TIMEOUT_S) as r:
        return list(text_string_to_metric_families(r.read().decode()))


class WorkersCollector:
    def __init__(self, group):
        self.group = group

    def collect(self):
        merged: dict[str, Metric] = {}
        totals: dict[tuple[str, str], float] = defaultdict(float)
        up = GaugeMetricFamily("polyindex_group_worker_up",
                               "1 when the worker answered this scrape", labels=["worker", "role"])
        restarts = GaugeMetricFamily("polyindex_group_worker_restarts",
                                     "Times the parent started the worker again after it died",
                                     labels=["worker", "role"])
        for w in self.group.workers:
            labels = {"worker": str(w.index), "role": w.role, "pid": str(w.pid)}
            restarts.add_metric([labels["worker"], w.role], max(w.restarts, 0))
            port = w.info.get("metrics_port")
            try:
                families = scrape(port) if port else None
            except OSError as e:
                log.info("metrics: worker %d did not answer: %s", w.index, e)
                families = None
            up.add_metric([labels["worker"], w.role], 1.0 if families is not None else 0.0)
            for fam in families or ():
                out = merged.get(fam.name)
                if out is None:
                    out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    out.samples.append(s._replace(labels={**s.labels, **labels}))
                    if s.name == "polyindex_requests_total":
                        totals[(s.labels["rpc"], s.labels["code"])] += s.value
        yield from merged.values()
        group_total = CounterMetricFamily("polyindex_group_requests",
                                          "RPCs by method and status code, all workers",
                                          labels=["rpc", "code"])
        for (rpc, code), value in sorted(totals.items()):
            group_total.add_metric([rpc, code], value)
        yield group_total
        yield up
        yield restarts

    def describe(self):
        return []  # dynamic: do not collect at registration time
