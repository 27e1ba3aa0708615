"""Progress display for long work: rich bars with rate and ETA, on stderr (log lines every
30 s where stderr is not a terminal: ``progress_log``).

``progress_bar`` is one bar (queries, records). ``Phases`` is a bulk run's display: the records
bar (read and encoded) and one row per phase that follows it on each segment (training a kind,
building a kind). A kind's train/build reports no progress of its own, so a phase row shows
its elapsed time while it runs, its docs/s once a segment is done, and, from the second
segment on, an ETA from the rate the same phase had so far.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from polyindex.ingest.progress_log import LogProgress, clock

REFRESH_PER_SECOND = 4  # elapsed times and ETAs move at least every second


class _Rate(TextColumn):
    def __init__(self, unit: str):
        super().__init__("")
        self.unit = unit

    def render(self, task):
        phase = task.fields.get("phase")
        speed = phase.rate() if phase is not None else (task.finished_speed or task.speed)
        unit = task.fields.get("unit", self.unit)
        return Text(f"{speed:,.0f} {unit}/s" if speed else f"- {unit}/s")


@contextmanager
def progress_bar(description: str, total: int | None, unit: str = "docs", enabled: bool = True):
    """Yields ``advance(n)``; a no-op when disabled (library use, tests)."""
    if not enabled:
        yield lambda n: None
        return
    console = Console(stderr=True)
    shown = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                     _Rate(unit), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                     console=console, transient=False, refresh_per_second=REFRESH_PER_SECOND) \
        if console.is_terminal else LogProgress(unit)
    with shown as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)




@dataclass
class _Phase:
    """Time spent in one phase over the segments so far, and the segment it is on now."""

    done: int = 0            # documents of the segments this phase has finished
    seconds: float = 0.0     # time those took
    since: float | None = None
    running: int = 0         # documents of the segment it is on now

    def rate(self) -> float | None:
        return self.done / self.seconds if self.done and self.seconds > 0 else None

    def elapsed(self) -> float:
        return self.seconds + (time.monotonic() - self.since if self.since is not None else 0.0)

    def eta(self) -> float | None:
        rate = self.rate()
        if self.since is None or rate is None:
            return None
        return self.running / rate - (time.monotonic() - self.since)


class _Elapsed(ProgressColumn):
    def render(self, task):
        phase = task.fields.get("phase")
        return Text(clock(phase.elapsed() if phase is not None else task.elapsed))


class _Eta(ProgressColumn):
    def render(self, task):
        phase = task.fields.get("phase")
        if phase is None:
            remaining = task.time_remaining
            return Text("ETA " + ("0:00:00" if task.finished else clock(remaining)))
        if phase.since is None:
            return Text("done" if phase.done else "")
        return Text("ETA " + clock(phase.eta()))


class Phases:
    """The display of one bulk run (see the module doc); every method is a no-op when
    disabled."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._bar = None
        self._rows: dict[str, tuple[int, _Phase]] = {}
        self._total: int | None = None

    def __enter__(self) -> "Phases":
        if self.enabled:
            console = Console(stderr=True)
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), _Rate("docs"), _Elapsed(), _Eta(),
                                 console=console, transient=False,
                                 refresh_per_second=REFRESH_PER_SECOND) \
                if console.is_terminal else LogProgress("docs")
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            # Rows end full: the records total also counts replaced and skipped records
            for task, ph in self._rows.values():
                self._bar.update(task, total=ph.done, completed=ph.done)
            self._bar.__exit__(*exc)

    def records(self, description: str, total: int | None):
        """The records bar: returns ``advance(n)``."""
        self._total = total
        if self._bar is None:
            return lambda n: None
        task = self._bar.add_task(description, total=total)
        return lambda n: self._bar.advance(task, n)

    @contextmanager
    def phase(self, name: str, docs: int):
        """One segment's pass of phase ``name`` (e.g. "building tree") over ``docs``."""
        if self._bar is None:
            yield
            return
        if name not in self._rows:
            ph = _Phase()
            self._rows[name] = (self._bar.add_task(f"  {name}", total=self._total, phase=ph), ph)
        task, ph = self._rows[name]
        ph.since, ph.running = time.monotonic(), docs
        try:
            yield
        finally:
            ph.seconds += time.monotonic() - ph.since
            ph.done += docs
            ph.since, ph.running = None, 0
            self._bar.advance(task, docs)


class ObservedKind:
    """An index kind whose ``train`` and ``build`` show as phases of a bulk run; everything
    else is the kind's own (the writer sees no difference)."""

    def __init__(self, kind, phases: Phases):
        self._kind, self._phases = kind, phases

    def __getattr__(self, name):
        return getattr(self._kind, name)

    def train(self, batch) -> None:
        with self._phases.phase(f"training {self._kind.kind}", len(batch.ids)):
            self._kind.train(batch)

    def build(self, batch, folder):
        with self._phases.phase(f"building {self._kind.kind}", len(batch.ids)):
            return self._kind.build(batch, folder)
