"""``polyindex snapshot``: create, restore, verify, list and delete snapshots of a collection.

A snapshot is taken from a data directory this command opens as its writer (``--data``: no
server may hold it) or by a running server (``--server``: written under the server's
``--snapshot-root``, named by ``--to NAME``). Restore works on files (the snapshot folder,
a data directory this command opens as its writer).
"""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from polyindex.errors import InvalidArgument

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Snapshots of a collection: create, restore, verify, list, delete.")
out = Console()

DataOpt = typer.Option(None, "--data", help="Data directory (opened as its writer: stop a server holding it, or use --server).")
ServerOpt = typer.Option(None, "--server", help="The polyindex server at HOST:PORT (started with --snapshot-root DIR).")
TokenOpt = typer.Option(None, "--token-file", help="With --server: file holding the bearer token.")
RootOpt = typer.Option(None, "--root", help="The folder holding snapshots (a server's --snapshot-root).")
JsonOpt = typer.Option(False, "--json", help="Print JSON (for programs) instead of a line.")


def _client(server: str, token_file: Optional[Path]):
    from polyindex.client.remote import Client
    return Client(server, token=token_file.read_text().strip() if token_file else None)


def _one_of(data, server, what: str = "--data DIR") -> None:
    if (data is None) == (server is None):
        raise InvalidArgument(f"give one of {what} or --server HOST:PORT")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class _Progress:
    """Progress on stderr: a line at most every 2 s (long work never looks hung), none for
    work done within the first 2 s."""

    def __init__(self, what: str):
        self.what, self.last = what, time.monotonic()

    def __call__(self, *args) -> None:
        phase, done, total = args if len(args) == 3 else ("copied", *args)
        now = time.monotonic()
        if now - self.last >= 2.0:
            self.last = now
            print(f"{self.what}: {_mb(done)} of {_mb(total)} {phase}", file=sys.stderr,
                  flush=True)


@app.command()
def create(collection: str = typer.Option(..., "--collection", "-c", help="Collection name."),
           to: str = typer.Option(..., "--to", metavar="PATH", help="Where the snapshot goes: a folder that does not exist yet (with --data), or a plain name under the server's --snapshot-root (with --server)."),
           data: Optional[Path] = DataOpt, server: Optional[str] = ServerOpt,
           token_file: Optional[Path] = TokenOpt,
           link: bool = typer.Option(False, "--link", help="With --data: hard-link the immutable segment files instead of copying them (same file system only; shares their disk blocks, so no protection against a damaged disk)."),
           as_json: bool = JsonOpt):
    """Snapshot a collection: every write acknowledged before it began, nothing half-applied.

    Writes and merges go on meanwhile; the snapshot appears at PATH only once complete."""
    _one_of(data, server)
    if server is not None:
        with _client(server, token_file) as client:
            info = client.collection(collection).snapshot(to)
    else:
        from polyindex.engine import Engine
        eng = Engine(data, create=False)
        try:
            info = eng.collection(collection).snapshot(
                Path(to), link=link, progress=_Progress("snapshot"))
        finally:
            eng.close()
    if as_json:
        print(json.dumps(info))
        return
    out.print(f"snapshot {info['path']}: collection {info['collection']!r}, "
              f"{info['documents']:,} documents, {info['segments']} segment(s), {info['files']} "
              f"files, {_mb(info['bytes'])}" +
              (f", {info['seconds']:.1f} s" if info.get("seconds") else ""),
              highlight=False, markup=False, soft_wrap=True)


@app.command()
def restore(path: Path = typer.Argument(..., help="The snapshot folder."),
            data: Path = typer.Option(..., "--data", help="Data directory to restore into (opened as its writer)."),
            collection: Optional[str] = typer.Option(None, "--collection", "-c", help="Restore under this name (default: the snapshot's collection name)."),
            force: bool = typer.Option(False, "--force", help="Replace an existing collection of that name."),
            as_json: bool = JsonOpt):
    """Restore a snapshot into a data directory, after checking every file of it.

    A damaged snapshot is refused naming the file; nothing is written then."""
    from polyindex.engine import Engine
    with Engine(data) as eng:
        info = eng.restore_snapshot(path, collection, force=force,
                                    progress=_Progress("restore"))
    if as_json:
        print(json.dumps(info))
        return
    out.print(f"restored {info['collection']!r} into {data}: {info['documents']:,} documents, "
              f"{info['segments']} segment(s), {info['files']} files, {_mb(info['bytes'])} "
              "checked and copied", highlight=False, markup=False, soft_wrap=True)


@app.command()
def verify(path: Path = typer.Argument(..., help="The snapshot folder."), as_json: bool = JsonOpt):
    """Check every file of a snapshot (sizes and xxh3 against its description)."""
    from polyindex.storage.restore import verify as check
    desc = check(path)
    n, size = len(desc["files"]), sum(v["size"] for v in desc["files"].values())
    if as_json:
        print(json.dumps({"path": str(path), "ok": True, "collection": desc["collection"],
                          "files": n, "bytes": size}))
    else:
        out.print(f"{path}: ok (collection {desc['collection']!r}, {n} files, {_mb(size)} "
                  "checked)", highlight=False, markup=False, soft_wrap=True)


@app.command("list")
def list_(root: Optional[Path] = RootOpt, server: Optional[str] = ServerOpt,
          token_file: Optional[Path] = TokenOpt, as_json: bool = JsonOpt):
    """List the snapshots under a folder or a server's --snapshot-root."""
    _one_of(root, server, "--root DIR")
    if server is not None:
        with _client(server, token_file) as client:
            snaps = client.list_snapshots()
    else:
        from polyindex.storage.restore import list_snapshots
        snaps = list_snapshots(root)
    if as_json:
        print(json.dumps(snaps))
        return
    if not snaps:
        out.print("no snapshots")
    for s in snaps:
        if s.get("problem"):
            out.print(f"{s['name']}: unreadable: {s['problem']}", style="red",
                      highlight=False, markup=False, soft_wrap=True)
            continue
        when = datetime.fromtimestamp(s["created_at"] or 0, timezone.utc)
        out.print(f"{s['name']}: collection {s['collection']!r}, {s['documents']:,} documents, "
                  f"{_mb(s['bytes'])}, taken {when:%Y-%m-%d %H:%M:%S} UTC",
                  highlight=False, markup=False, soft_wrap=True)


@app.command()
def delete(name: str = typer.Argument(..., help="The snapshot's name (under the folder or the server's root)."),
           root: Optional[Path] = RootOpt, server: Optional[str] = ServerOpt,
           token_file: Optional[Path] = TokenOpt):
    """Delete a snapshot under a folder or a server's --snapshot-root."""
    _one_of(root, server, "--root DIR")
    if server is not None:
        with _client(server, token_file) as client:
            client.delete_snapshot(name)
    else:
        from polyindex.storage.restore import delete as remove
        remove(root, name)
    out.print(f"deleted snapshot {name}", highlight=False, markup=False)
