"""Progress as log lines, for a stderr that is not a terminal (a log file, a CI job, a pipe).

rich draws its bars only on a terminal; elsewhere it printed nothing until the end, so a
22-minute index looked hung. ``LogProgress`` stands in for ``rich.progress.Progress`` (the
calls ``progress`` makes: ``add_task``, ``advance``, ``update``, enter/exit) and writes one
line per task every ``POLYINDEX_PROGRESS_SECONDS`` (30 s) from a timer thread, so a phase
that reports nothing for minutes (training, building) still shows it is running, and a last
line per task at the end:

    progress: indexing d.jsonl: 12,800/50,000 docs (26%), 41 docs/s, 0:05:12 elapsed, ETA 0:15:07
    progress:   building dense: running 0:01:40 (10,000/50,000 docs done at 512 docs/s, ETA 0:01:20)
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from polyindex.config import settings


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class _Task:
    description: str
    total: int | None
    unit: str
    fields: dict = field(default_factory=dict)
    completed: int = 0
    start: float = field(default_factory=time.monotonic)
    finished_at: float | None = None

    def line(self, now: float) -> str:
        phase = self.fields.get("phase")
        name = self.description.replace("[bold]", "").replace("[/bold]", "")
        if phase is not None:  # a phase of a bulk run (``progress._Phase``)
            rate = phase.rate()
            done = (f"{self.completed:,}" + (f"/{self.total:,}" if self.total else "") +
                    f" {self.unit} done" + (f" at {rate:,.0f} {self.unit}/s" if rate else ""))
            if phase.since is None:
                return f"{name}: {done}, {clock(phase.elapsed())} in all"
            return (f"{name}: running {clock(phase.elapsed())} ({done}, "
                    f"ETA {clock(phase.eta())})")
        elapsed = (self.finished_at or now) - self.start
        rate = self.completed / elapsed if elapsed > 0 else 0.0
        count = f"{self.completed:,}" + (f"/{self.total:,}" if self.total else "")
        pct = f" ({100 * self.completed / self.total:.0f}%)" if self.total else ""
        eta = ""
        if self.total and self.finished_at is None:
            eta = ", ETA " + clock((self.total - self.completed) / rate if rate else None)
        return (f"{name}: {count} {self.unit}{pct}, {rate:,.1f} {self.unit}/s, "
                f"{clock(elapsed)} elapsed{eta}")


class LogProgress:
    """The subset of ``rich.progress.Progress`` that ``progress`` uses, as periodic lines."""

    def __init__(self, unit: str = "docs", every: float | None = None, stream=None):
        self.unit = unit
        self.every = settings().progress_seconds if every is None else every
        self.stream = stream if stream is not None else sys.stderr
        self._tasks: list[_Task] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "LogProgress":
        self._thread = threading.Thread(target=self._run, name="progress-log", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        now = time.monotonic()
        with self._lock:
            for t in self._tasks:
                t.finished_at = t.finished_at or now
        self._emit(now)  # the last word: totals and rates, whatever the interval

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._emit(time.monotonic())

    def _emit(self, now: float) -> None:
        with self._lock:
            lines = [f"progress: {t.line(now)}\n" for t in self._tasks]
        try:
            self.stream.write("".join(lines))
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not fail the work it reports on
            pass

    def add_task(self, description: str, total: int | None = None, **fields) -> int:
        with self._lock:
            self._tasks.append(_Task(description, total, fields.pop("unit", self.unit), fields))
            return len(self._tasks) - 1

    def advance(self, task: int, n: float) -> None:
        with self._lock:
            self._tasks[task].completed += int(n)

    def update(self, task: int, total: int | None = None, completed: int | None = None) -> None:
        with self._lock:
            t = self._tasks[task]
            t.total = t.total if total is None else total
            t.completed = t.completed if completed is None else completed
