"""How ``polyindex info`` shows a collection to a person: labelled lines, no Python reprs."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_LABELS = [("documents", "documents"), ("segments", "segments"), ("deleted_rows", "deleted rows"),
           ("bytes_on_disk", "bytes on disk"), ("bytes_reclaimable", "bytes reclaimable"),
           ("indexes", "indexes"), ("profiles", "profiles"), ("model", "model"),
           ("encoder", "encoder"),
           ("vector_fields", "your vector fields"), ("segment_size", "segment size"),
           ("fields", "fields"), ("ingest", "last ingest"),
           ("version", "manifest version"), ("format_version", "format")]


def _value(key: str, value, info: dict) -> str:
    if key == "model" and (value is None or info.get("encodes_text") is False):
        return "none (no index encodes text)"  # lexical only, or the user's own vectors
    if value is None or value == [] or value == {}:
        return "-"
    if key == "encoder":  # polyindex adapt's (storage.encoders)
        if info.get("encodes_text") is False:
            return "-"
        return "base (the model as it is)" if value == "base" else \
            f"{value}, adapted to this collection (adapt --revert goes back)"
    if key == "model":
        choice = info.get("dtype_choice")
        return f"{value}, {info.get('dtype', '?')}" + (f" ({choice})" if choice else "")
    if key == "vector_fields":  # one "name: dim D, metric, index" per field
        return "; ".join(f"{n}: " + ", ".join(
            [f"dim {f['dim']}" if f.get("dim") else "dim from the first vector",
             f.get("metric") or "ip", f"index {f['index']}" if f.get("index") else "no index"])
            for n, f in value.items())
    if key == "fields":
        return ", ".join(f"{n}:{t}" for n, t in value.items())
    if key == "ingest":
        src = value.get("source") or {}
        state = "done" if value.get("done") else "interrupted, resumes"
        skipped = value.get("skipped_invalid") or 0
        return (f"{Path(src.get('path', '?')).name} ({src.get('format', '?')}): {state} at record "
                f"{value.get('position', 0):,}" + (f", {skipped:,} invalid skipped" if skipped else ""))
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def hit_json(hit, with_text: bool, with_metadata: bool, explain: bool) -> dict:
    """A hit for ``query --json``: rank, id and score, then only the fields it has (no
    empty title, text or metadata) among those asked for."""
    out = {"rank": hit.rank, "id": hit.id, "score": hit.score}
    for key, value, asked in (("title", hit.title, True), ("text", hit.text, with_text),
                              ("metadata", hit.metadata, with_metadata),
                              ("explain", hit.explain, explain)):
        if asked and value not in (None, "", {}, []):
            out[key] = value
    return out


def profile_ran(coll, profile, text, vector, using) -> str:
    """The name of the profile a ``query`` ran: the one given, or the collection's default
    for that query (a vector query: its field's index, or fusion over the fields given)."""
    if isinstance(profile, str):
        return profile
    if vector is not None:
        from polyindex.query.requests import default_vector_profile, make_queries
        name = default_vector_profile(make_queries(None if text is None else [text], [vector],
                                                   using), using, coll.kinds)
        if isinstance(name, dict):
            return "rrf of " + ", ".join(s["index"] for s in name["retrieve"])
        if name is not None:
            return name
    from polyindex.query.profiles import default_profile
    return default_profile(list(coll.kinds), coll.profiles())


def show_collection(out: Console, info: dict) -> None:
    out.print(f"[bold]{escape(info['name'])}[/bold]")
    shown = {k for k, _ in _LABELS} | {"name", "dtype", "dtype_choice", "encodes_text"}
    rows = [(label, _value(key, info.get(key), info)) for key, label in _LABELS if key in info]
    rows += [(key.replace("_", " "), _value(key, v, info)) for key, v in info.items()
             if key not in shown]  # online-mode extras (buffered writes, WAL bytes)
    width = max(len(label) for label, _ in rows)
    for label, text in rows:
        out.print(f"  {label:<{width}}  {escape(text)}", highlight=False, soft_wrap=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def show_compaction(out: Console, report: dict) -> None:
    b, a = report["before"], report["after"]
    table = Table(title=f"compacted {report['collection']} in {report['seconds']:.1f} s "
                        f"({len(report['merges'])} merge(s))", title_justify="left")
    for col in ("", "segments", "rows", "deleted rows", "on disk", "reclaimable"):
        table.add_column(col, justify="right" if col else "left")
    for label, r in (("before", b), ("after", a)):
        table.add_row(label, f"{r['segments']:,}", f"{r['rows']:,}", f"{r['deleted_rows']:,}",
                      _mb(r["bytes_on_disk"]), _mb(r["bytes_reclaimable"]))
    out.print(table)


def show_collections(out: Console, data: Path, infos: list[dict]) -> None:
    if not infos:
        out.print(f"no collections in {data} (create one with `polyindex index SRC --data {data} "
                  "--collection NAME`)", highlight=False)
        return
    table = Table(title=f"collections in {data}", title_justify="left")
    for col, justify in (("name", "left"), ("documents", "right"), ("segments", "right"),
                         ("indexes", "left")):
        table.add_column(col, justify=justify)
    for info in infos:
        table.add_row(escape(info["name"]), f"{info['documents']:,}", f"{info['segments']:,}",
                      escape(", ".join(info["indexes"])))
    out.print(table)


def show_server(out: Console, address: str, stats: dict) -> None:
    """A running server's processes (``polyindex info --server``) and collections."""
    table = Table(title=f"server {address}: {len(stats['processes'])} process(es), "
                        f"{stats['requests_all_total']:,} requests", title_justify="left")
    for col, justify in (("worker", "right"), ("pid", "right"), ("role", "left"),
                         ("uptime s", "right"), ("requests", "right"), ("restarts", "right"),
                         ("state", "left")):
        table.add_column(col, justify=justify)
    for p in stats["processes"]:
        table.add_row(str(p["worker"]), str(p["pid"] or "-"), p["role"] or "-",
                      f"{p['uptime_s']:.0f}", f"{p['requests_total']:,}", str(p["restarts"]),
                      escape(p["error"]) if p["error"] else "serving")
    out.print(table)
    for name, c in stats["collections"].items():
        out.print(f"  {escape(name)}: {c['documents']:,} documents, {c['segments']:,} segments",
                  highlight=False)


def show_settings(out: Console, table: list[dict]) -> None:
    """The process settings (``polyindex info --settings``): set ones first, then defaults."""
    view = Table(title="settings (POLYINDEX_* environment variables)", title_justify="left")
    for col in ("variable", "value", "default", "what it does"):
        view.add_column(col, overflow="fold")
    for s in sorted(table, key=lambda s: not s["set"]):
        view.add_row(s["env"], f"[bold]{escape(str(s['value']))}[/bold]" if s["set"]
                     else escape(str(s["value"])), escape(str(s["default"])), escape(s["doc"]))
    out.print(view)
