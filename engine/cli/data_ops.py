"""``polyindex count``, ``polyindex delete --filter`` and ``polyindex scroll``: the data
operations of the SDK (``count(filter)``, ``delete_where``, ``scroll``) on a data directory
(``--data``: reads open it read-only, beside a running server; ``delete`` needs its writer
lock) or through a server (``--server HOST:PORT``, its writer).

People get a line or a table; ``--json`` prints JSON for programs (scroll: one page, with the
cursor of the next; pass it back with ``--cursor``).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from polyindex.errors import InvalidArgument

out = Console()

DataOpt = typer.Option(None, "--data", help="Data directory holding the collection.")
ServerOpt = typer.Option(None, "--server", help="Go through the polyindex server at HOST:PORT instead of --data.")
TokenOpt = typer.Option(None, "--token-file", help="With --server: file holding the bearer token.")
CollOpt = typer.Option(..., "--collection", "-c", help="Collection name.")
FilterOpt = typer.Option(None, "--filter", metavar="JSON", help='A filter in the query filter language, e.g. \'{"year": {"gte": 1990}, "lang": "en"}\'.')
JsonOpt = typer.Option(False, "--json", help="Print JSON (for programs) instead of a table.")


def parse_filter(text: str | None, required: bool = False) -> dict | None:
    if text is None:
        if required:
            raise InvalidArgument("--filter JSON is required (to delete everything, drop the "
                                  "collection)")
        return None
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"--filter is not JSON: {e}") from None
    if not isinstance(spec, dict) or not spec:
        raise InvalidArgument(f"--filter must be a non-empty JSON object, got {text!r}")
    return spec


@contextmanager
def opened(data: Path | None, server: str | None, token_file: Path | None, name: str,
           write: bool = False):
    """The collection ``name`` of a data directory or of a server (exactly one given)."""
    if (data is None) == (server is None):
        raise InvalidArgument("give --data DIR or --server HOST:PORT (one of them)")
    if server is not None:
        from polyindex.client.remote import Client
        token = token_file.read_text().strip() if token_file else None
        with Client(server, token=token) as client:
            yield client.collection(name)
        return
    from polyindex.engine import Engine
    eng = Engine(data, readonly=not write, create=False)
    try:
        yield eng.collection(name)
    finally:
        eng.close()


def count(data: Optional[Path] = DataOpt, server: Optional[str] = ServerOpt,
          token_file: Optional[Path] = TokenOpt, collection: str = CollOpt,
          filter: Optional[str] = FilterOpt, as_json: bool = JsonOpt):
    """Count the live documents of a collection, or those a filter matches."""
    spec = parse_filter(filter)
    with opened(data, server, token_file, collection) as coll:
        n = coll.count(spec)
    print(json.dumps({"collection": collection, "count": n, "filter": spec}) if as_json else n)


def delete(data: Optional[Path] = DataOpt, server: Optional[str] = ServerOpt,
           token_file: Optional[Path] = TokenOpt, collection: str = CollOpt,
           filter: Optional[str] = FilterOpt,
           ids: Optional[List[str]] = typer.Option(None, "--id", help="Delete this id (repeatable) instead of a filter."),
           as_json: bool = JsonOpt):
    """Delete the documents a filter matches (or the ids given), at one point in time."""
    if ids and filter is not None:
        raise InvalidArgument("give --filter or --id, not both")
    spec = None if ids else parse_filter(filter, required=True)
    with opened(data, server, token_file, collection, write=True) as coll:
        n = coll.delete(list(ids)) if ids else coll.delete_where(spec)
    if as_json:
        print(json.dumps({"collection": collection, "deleted": n}))
    else:
        out.print(f"deleted {n} document{'s' if n != 1 else ''} from {collection}",
                  highlight=False)


def scroll(data: Optional[Path] = DataOpt, server: Optional[str] = ServerOpt,
           token_file: Optional[Path] = TokenOpt, collection: str = CollOpt,
           filter: Optional[str] = FilterOpt,
           limit: int = typer.Option(20, "--limit", help="Documents in the page (1..10000)."),
           cursor: Optional[str] = typer.Option(None, "--cursor", help="The cursor a previous page printed: the page after it."),
           fields: Optional[str] = typer.Option(None, "--fields", metavar="A,B", help="Only these metadata fields (comma-separated; empty: none)."),
           as_json: bool = JsonOpt):
    """Page through a collection in a stable order (by id hash); prints the next cursor."""
    spec = parse_filter(filter)
    names = None if fields is None else [f for f in fields.split(",") if f]
    with opened(data, server, token_file, collection) as coll:
        page = coll.scroll(filter=spec, limit=limit, cursor=cursor, fields=names)
    if as_json:
        docs = [{"id": d.id, **({"title": d.title} if d.title else {}), "text": d.text,
                 **({"metadata": d.metadata} if d.metadata else {})} for d in page.documents]
        print(json.dumps({"documents": docs, "cursor": page.cursor}, ensure_ascii=False))
        return
    table = Table("id", "title", "text", "metadata", title=f"{collection}: "
                  f"{len(page.documents)} document{'s' if len(page.documents) != 1 else ''}")
    for d in page.documents:
        text = d.text if len(d.text) <= 60 else d.text[:59] + "…"
        table.add_row(d.id, d.title, text, json.dumps(d.metadata, ensure_ascii=False)
                      if d.metadata else "")
    out.print(table)
    out.print(f"next page: --cursor {page.cursor}" if page.cursor else "(last page)",
              highlight=False, soft_wrap=True)
