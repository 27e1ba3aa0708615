"""``polyindex export``: a collection (of a data directory, or through a server) to a
Parquet file that ``polyindex index`` reads back (the format: ``ingest.export``).

Streamed a page at a time (memory: one page), with progress on stderr: a bar on a terminal,
else a line every tenth of the way.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import typer

from polyindex.cli.data_ops import CollOpt, DataOpt, JsonOpt, ServerOpt, TokenOpt, opened


def _progress(enabled: bool, stack: ExitStack):
    """``advance(done, total)``: a rich bar on a terminal (closed with ``stack``), else a
    log line every tenth of the way."""
    if not enabled:
        return lambda done, total: None
    if sys.stderr.isatty():
        from polyindex.ingest.progress import progress_bar
        state = {"step": None, "last": 0}

        def advance(done, total):
            if state["step"] is None:  # the total is known once the export has begun
                state["step"] = stack.enter_context(progress_bar("export", total))
            state["step"](done - state["last"])
            state["last"] = done
        return advance
    start, said = time.monotonic(), [0]

    def advance(done, total):
        tenth = 10 * done // max(total, 1)
        if tenth > said[0]:
            said[0] = tenth
            print(f"export: {done}/{total} documents ({time.monotonic() - start:.1f} s)",
                  file=sys.stderr, flush=True)
    return advance


def export(data: Optional[Path] = DataOpt, server: Optional[str] = ServerOpt,
           token_file: Optional[Path] = TokenOpt, collection: str = CollOpt,
           to: Path = typer.Option(..., "--to", metavar="FILE.parquet", help="The Parquet file to write (replaced when complete)."),
           progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress on stderr."),
           as_json: bool = JsonOpt):
    """Write a collection (ids, title, text, metadata, stored vectors) to a Parquet file."""
    from polyindex.ingest.export import export as write
    with opened(data, server, token_file, collection) as coll, ExitStack() as stack:
        start = time.monotonic()
        n = write(to, coll.info(), coll.count(), coll.scroll,
                  _progress(progress and not as_json, stack))
    took = time.monotonic() - start
    if as_json:
        print(json.dumps({"collection": collection, "exported": n, "to": str(to),
                          "seconds": round(took, 3)}))
    else:
        print(f"exported {n} documents of {collection} to {to} in {took:.1f} s")
