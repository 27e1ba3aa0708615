"""Progress display for long work: a rich bar with rate and ETA, on stderr."""
from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class _Rate(TextColumn):
    def __init__(self, unit: str):
        super().__init__("")
        self.unit = unit

    def render(self, task):
        speed = task.finished_speed or task.speed
        from rich.text import Text
        return Text(f"{speed:,.0f} {self.unit}/s" if speed else f"- {self.unit}/s")


@contextmanager
def progress_bar(description: str, total: int | None, unit: str = "docs", enabled: bool = True):
    """Yields ``advance(n)``; a no-op when disabled (library use, tests)."""
    if not enabled:
        yield lambda n: None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  _Rate(unit), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
