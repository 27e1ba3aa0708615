"""The house's rules, checked: rooms, clean edges between layers, a client that stands alone."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
# What index/ and rerank/ may import from the engine (the rest of the engine sits above them).
LOWER_MAY_IMPORT = {"polyindex.errors", "polyindex.types", "polyindex.config"}
ENGINE_TOP = {p.stem for p in ENGINE.glob("*.py")} | {p.name for p in ENGINE.iterdir()
                                                      if (p / "__init__.py").is_file()}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports (absolute names), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _engine_module(name: str) -> str | None:
    """The engine module or room ``polyindex.X...`` names, None if it is not the engine's."""
    parts = name.split(".")
    if parts[0] != "polyindex" or len(parts) < 2 or parts[1] not in ENGINE_TOP:
        return None
    return ".".join(parts[:2])


@pytest.mark.parametrize("layer", ["index", "rerank"])
def test_lower_layers_import_only_errors_types_and_config_from_the_engine(layer):
    edges = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for line, name in _imports(path):
            mod = _engine_module(name)
            if mod is not None and mod not in LOWER_MAY_IMPORT:
                edges.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not edges, "layering violations:\n" + "\n".join(edges)


def test_the_walker_sees_a_forbidden_edge(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from polyindex.storage.segment import Segment\n")
    assert [_engine_module(n) for _, n in _imports(bad)][0] == "polyindex.storage"
    assert _engine_module("polyindex.index.protocol") is None


def test_engine_top_level_is_small_and_every_room_says_what_it_holds():
    modules = sorted(p.name for p in ENGINE.glob("*.py"))
    assert len(modules) <= 6, modules
    rooms = [p for p in ENGINE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    assert len(rooms) >= 8
    for room in rooms:
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) == 1, f"{room.name}/__init__.py needs a one-line docstring"


def test_the_client_loads_no_storage_writer_encoder_or_dataset_module():
    code = ("import sys, polyindex.client\n"
            "c = polyindex.client.Client\n"
            "print('\\n'.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert "polyindex.client.remote" in out
    forbidden = ("polyindex.storage", "polyindex.online", "polyindex.encode", "polyindex.engine",
                 "polyindex.collection", "polyindex.ingest.sources", "polyindex.ingest.bulk",
                 "polyindex.query", "pyarrow.dataset", "sentence_transformers", "torch", "faiss")
    loaded = [m for m in out if m.startswith(forbidden)]
    assert not loaded, f"the client pulled in {loaded}"


def _mismatches(impl, proto) -> list[str]:
    """How ``impl``'s methods differ from the protocol's signatures: a protocol parameter
    missing or of another kind or default, or an extra parameter a caller would have to pass."""
    import inspect
    out = []
    for name, want in vars(proto).items():
        if name.startswith("_") or not callable(want):
            continue
        have = getattr(impl, name, None)
        if have is None:
            out.append(f"{impl.__name__}.{name} is missing")
            continue
        p_want = list(inspect.signature(want).parameters.values())[1:]
        p_have = dict(list(inspect.signature(have).parameters.items())[1:])
        for p in p_want:
            q = p_have.pop(p.name, None)
            if q is None or q.kind != p.kind or (
                    p.default is not Ellipsis and q.default != p.default):
                out.append(f"{impl.__name__}.{name}: parameter {p} is {q}")
        for q in p_have.values():
            if q.kind != q.KEYWORD_ONLY or q.default is q.empty:
                out.append(f"{impl.__name__}.{name}: extra parameter {q} must be keyword-only "
                           "with a default")
    return out


def test_embedded_remote_and_sharded_implement_one_interface():
    from polyindex.client.remote import Client, RemoteCollection
    from polyindex.collection import Collection
    from polyindex.distributed.router import ShardedCollection
    from polyindex.distributed.serving import ShardedEngine
    from polyindex.engine import Engine
    from polyindex.types import CollectionAPI, EngineAPI
    bad = [m for impl in (Collection, RemoteCollection, ShardedCollection)
           for m in _mismatches(impl, CollectionAPI)]
    bad += [m for impl in (Engine, Client, ShardedEngine) for m in _mismatches(impl, EngineAPI)]
    assert not bad, "\n".join(bad)


def test_the_interface_check_sees_a_drifted_signature():
    from polyindex.types import CollectionAPI

    class Drifted:
        def query(self, text, k=5): ...
    assert any("query" in m for m in _mismatches(Drifted, CollectionAPI))


def test_only_config_reads_polyindex_settings():
    """Every ``POLYINDEX_*`` variable is read by ``polyindex.config`` alone (``settings()``):
    no other module of the package names one outside its docstrings (bench/ and tests/ set
    some for the processes they start)."""
    found = []
    for folder in ("engine", "index", "rerank", "cuda", "proto"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ENGINE / "config.py":
                continue
            tree = ast.parse(path.read_text(), str(path))
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                      ast.AsyncFunctionDef))
                    and n.body and isinstance(n.body[0], ast.Expr)
                    and isinstance(n.body[0].value, ast.Constant)}
            found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and isinstance(n.value, str)
                      and n.value.startswith("POLYINDEX_") and id(n) not in docs]
    assert not found, "POLYINDEX_* read outside polyindex.config:\n" + "\n".join(found)


def test_settings_are_checked_and_documented_in_one_table():
    import re

    from polyindex.config import Settings
    from polyindex.errors import InvalidArgument
    assert Settings.from_environ({}) == Settings()
    got = Settings.from_environ({"POLYINDEX_SEAL_DOCS": "20", "POLYINDEX_MERGE": "off"})
    assert (got.seal_docs, got.merge) == (20, False)
    for env, bad, why in (("POLYINDEX_SEAL_DOCS", "many", "not an integer"),
                          ("POLYINDEX_SEAL_DOCS", "0", "out of range"),
                          ("POLYINDEX_MERGE", "maybe", "not a boolean"),
                          ("POLYINDEX_KERNELS", "cuda", "not one of"),
                          ("POLYINDEX_SEAL_DOC", "5", "unknown setting POLYINDEX_SEAL_DOC")):
        with pytest.raises(InvalidArgument, match=why):
            Settings.from_environ({env: bad})
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(POLYINDEX_[A-Z_]+)` \| `([^`]*)` \|", readme, re.M))
    assert rows == {s["env"]: s["default_text"] for s in Settings().table()}


def test_a_bad_setting_stops_the_cli_with_one_line(tmp_path):
    import os
    res = subprocess.run([sys.executable, "-m", "polyindex.cli.main", "info", "--settings"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "POLYINDEX_SEAL_SECONDS": "soon"})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error (INVALID_ARGUMENT): POLYINDEX_SEAL_SECONDS='soon' is not a number (online "
        "writes: or when the oldest buffered write is this old)"]
    res = subprocess.run([sys.executable, "-m", "polyindex.cli.main", "info", "--settings",
                          "--json"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "POLYINDEX_SEAL_DOCS": "7"})
    table = {s["env"]: s for s in __import__("json").loads(res.stdout)}
    assert table["POLYINDEX_SEAL_DOCS"]["value"] == 7 and table["POLYINDEX_SEAL_DOCS"]["set"]


KINDS = ("dense", "lexical", "multivector", "sparse", "tree")


def test_each_index_kind_has_its_own_room_and_the_registry_lists_them():
    """``index/`` holds the shared parts (protocol, registry, postings, masks, ...) as modules
    and one room per kind, whose ``kind.py`` is the kind; a kind's parts live in its room
    (no ``index/dense_*.py`` beside it), the protocol imports no kind, and the registry
    names every kind explicitly."""
    index = ROOT / "index"
    rooms = sorted(p.name for p in index.iterdir() if (p / "__init__.py").is_file())
    assert rooms == sorted(KINDS)
    for room in KINDS:
        assert (index / room / "kind.py").is_file(), f"index/{room}/kind.py is missing"
        doc = ast.get_docstring(ast.parse((index / room / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) == 1, \
            f"index/{room}/__init__.py needs a one-line docstring"
    strays = [p.name for p in index.glob("*.py") if p.stem.startswith(KINDS)]
    assert not strays, f"a kind's parts outside its room: {strays}"
    assert not [n for _, n in _imports(index / "protocol.py") if n.startswith(
        tuple(f"polyindex.index.{k}" for k in KINDS))], "protocol.py imports a kind"
    from polyindex.index.registry import builtin_kinds
    assert sorted(builtin_kinds()) == sorted(KINDS)
    for name, cls in builtin_kinds().items():
        assert cls.__module__ == f"polyindex.index.{name}.kind"


def test_one_score_rows_loop():
    """Scoring given rows is one numba loop, ``postings.score_rows``: each kind's
    ``*_score_rows`` only hands it its scorer (the loop was copied three times once)."""
    copies = []
    for path in sorted((ROOT / "index").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_score_rows"):
                calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call)
                         and isinstance(c.func, ast.Name)}
                loops = [n for n in ast.walk(node) if isinstance(n, (ast.For, ast.While))]
                if "score_rows" not in calls or loops:
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not copies, "a score-rows loop outside postings.score_rows:\n" + "\n".join(copies)


def test_index_init_files_only_re_export():
    """``index/``'s ``__init__.py`` files hold a docstring and imports, nothing else. (The
    engine's own resolves ``polyindex.open`` and friends on first use: PEP 562, for the
    client's sake.)"""
    bad = []
    for folder in ("index",):
        for path in sorted((ROOT / folder).rglob("__init__.py")):
            body = ast.parse(path.read_text()).body
            for node in body:
                if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
                    continue
                if isinstance(node, ast.Assign) and all(
                        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "logic in __init__.py:\n" + "\n".join(bad)


def test_no_import_circles():
    """No module imports (at the top or lazily) a module that imports it back, directly or
    through others: a circle makes import order matter and hides a layer that is not one.
    A module importing a name from its own package (``from polyindex.client import
    _grpc_channel``, a compiled extension) is not an edge: the package is already loading."""
    roots = {"engine": "polyindex", "index": "polyindex.index", "rerank": "polyindex.rerank",
             "proto": "polyindex.proto", "cuda": "polyindex.cuda"}
    mods = {}
    for folder, prefix in roots.items():
        for py in (ROOT / folder).rglob("*.py"):
            parts = [p for p in py.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            if "__pycache__" not in parts:
                mods[".".join([prefix, *parts])] = py

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        deps = {resolve(name) for _, name in _imports(path)} - {None, mod}
        graph[mod] = {d for d in deps if not mod.startswith(d + ".")}
    circles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def test_collection_is_a_thin_facade_over_the_storage_table():
    """Issue 42: ``Collection`` keeps the user API (at most 300 lines); storage, online writes
    and bulk ingest are handed the storage table (``storage.table.Table``), never the
    collection, so no call points back up a layer."""
    lines = len((ENGINE / "collection.py").read_text().splitlines())
    assert lines <= 300, f"engine/collection.py has {lines} lines"
    edges = []
    for room in ("storage", "online", "ingest"):
        for path in sorted((ENGINE / room).rglob("*.py")):
            for line, name in _imports(path):
                if name == "polyindex.collection" or name.startswith("polyindex.collection."):
                    edges.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            if "Collection(" in path.read_text() or "coll." in path.read_text():
                edges.append(f"{path.relative_to(ROOT)} is handed a collection")
    assert not edges, "\n".join(edges)


def test_storage_imports_only_index_from_the_rooms():
    """The table lives in storage/, which knows nothing of the rooms above it (encoding is
    handed in): besides the top-level modules, storage imports only ``index``."""
    edges = []
    for path in sorted((ENGINE / "storage").rglob("*.py")):
        for line, name in _imports(path):
            mod = _engine_module(name)
            if mod is not None and mod not in LOWER_MAY_IMPORT | {"polyindex.storage"} \
                    and (ENGINE / mod.split(".")[1]).is_dir():
                edges.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not edges, "storage reaches up:\n" + "\n".join(edges)


def test_the_console_stands_on_the_client():
    """The web console (issue 44) reaches the collections only through the SDK's client, so
    it shows what a client gets: besides the top-level modules it imports ``client``,
    ``cli.evaluate`` (the shared evaluation) and ``ingest.sources`` (queries and qrels
    files); and the service never imports the console (the CLI composes them)."""
    allowed = ("polyindex.console", "polyindex.client", "polyindex.cli.evaluate",
               "polyindex.ingest.sources")
    edges = []
    for path in sorted((ENGINE / "console").rglob("*.py")):
        for line, name in _imports(path):
            mod = _engine_module(name)
            if mod is None or not (ENGINE / mod.split(".")[1]).is_dir():
                continue  # not the engine's, or a top-level module (errors, types, ...)
            if not (name + ".").startswith(tuple(a + "." for a in allowed)):
                edges.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    for path in sorted((ENGINE / "service").rglob("*.py")):
        edges += [f"{path.relative_to(ROOT)}:{line} imports {name}"
                  for line, name in _imports(path) if name.startswith("polyindex.console")]
    assert not edges, "\n".join(edges)
