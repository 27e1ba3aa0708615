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
