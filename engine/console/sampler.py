"""The server's load over the last minutes: queries per second and mean query latency, one
point every ``interval`` seconds, from the server's own counters (Stats' request counts, the
latency histogram's count and sum) sampled by a thread."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

INTERVAL_S = 5.0
POINTS = 120  # 10 minutes at 5 s


class Sampler:
    def __init__(self, queries: Callable[[], int],
                 latency: Callable[[], tuple[float, float]] | None = None,
                 interval: float = INTERVAL_S, points: int = POINTS):
        """``queries()``: the Query calls served so far; ``latency()``: (count, seconds) of
        the Query latency histogram, when the console runs in the server's process."""
        self._queries, self._latency, self.interval = queries, latency, interval
        self._points: deque = deque(maxlen=points)
        self._last = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polyindex-console-sampler",
                                        daemon=True)

    def start(self) -> "Sampler":
        try:
            self.sample()
        except Exception:  # noqa: BLE001 - the server is still starting: the next one counts
            pass
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed sample is a gap in the chart
                pass

    def sample(self) -> None:
        now = time.time()
        q = self._queries()
        lat = self._latency() if self._latency is not None else None
        with self._lock:
            if self._last is not None:
                t0, q0, lat0 = self._last
                dt = max(now - t0, 1e-9)
                point = {"t": now, "qps": max(0, q - q0) / dt, "latency_ms": None}
                if lat is not None and lat0 is not None and lat[0] > lat0[0]:
                    point["latency_ms"] = 1000 * (lat[1] - lat0[1]) / (lat[0] - lat0[0])
                self._points.append(point)
            self._last = (now, q, lat)

    def series(self) -> dict:
        with self._lock:
            return {"interval_s": self.interval, "points": list(self._points),
                    "latency": self._latency is not None}
