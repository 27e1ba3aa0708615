"""Documented defaults equal the code's: what ``--index KIND`` alone builds.

Each kind's default factory string is stated in three places: the defaults table of README.md,
the defaults table of docs/ARCHITECTURE.md (rows ``| `kind` | `factory string` | ...``) and the
kind's module docstring (``Default: ``factory string``.``). Each must equal
``from_factory(kind).describe()``, the string ``polyindex info`` shows and the manifest stores,
so the documentation and the code cannot drift apart again (issue 23: the sparse kind's docs
said one configuration, the code built another).
"""
import importlib
import re
from pathlib import Path

import pytest

from polyindex.index.registry import from_factory

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("lexical", "dense", "multivector", "sparse", "tree")
TABLE_ROW = re.compile(r"^\|\s*`([a-z]+)`\s*\|\s*`([^`]+)`\s*\|", re.MULTILINE)
DOCSTRING = re.compile(r"Default: ``([^`]+)``")


def table_defaults(path: Path) -> dict[str, list[str]]:
    """kind -> every factory string the file's table rows give for it."""
    found: dict[str, list[str]] = {}
    for kind, factory in TABLE_ROW.findall(path.read_text(encoding="utf-8")):
        if kind in KINDS:
            found.setdefault(kind, []).append(factory)
    return found


def code_default(kind: str) -> str:
    return from_factory(kind).describe()


@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md"])
def test_doc_tables_state_the_code_defaults(doc):
    found = table_defaults(ROOT / doc)
    assert sorted(found) == sorted(KINDS), f"{doc}: the defaults table misses a kind"
    for kind in KINDS:
        assert found[kind] == [code_default(kind)], (
            f"{doc} says --index {kind} is {found[kind]}, the code builds {code_default(kind)!r}")


@pytest.mark.parametrize("kind", KINDS)
def test_module_docstring_states_the_code_default(kind):
    doc = importlib.import_module(f"polyindex.index.{kind}.kind").__doc__ or ""
    stated = DOCSTRING.findall(doc)
    assert stated == [code_default(kind)], (
        f"index/{kind}/kind.py's docstring says the default is {stated}, the code builds "
        f"{code_default(kind)!r}")


def test_default_strings_are_normal_forms():
    """A documented default read back by the parser describes itself unchanged, so what the
    docs show is also what a user can paste."""
    for kind in KINDS:
        text = code_default(kind)
        assert text.partition(":")[0] == kind
        assert from_factory(text).describe() == text


def test_the_parser_would_see_drift(tmp_path):
    """The check can fail: a table row that disagrees with the code is found as such."""
    doc = tmp_path / "x.md"
    doc.write_text("| kind | default |\n|---|---|\n| `sparse` | `sparse:UHD16384,k=64` | x |\n")
    assert table_defaults(doc) == {"sparse": ["sparse:UHD16384,k=64"]}
    assert table_defaults(doc)["sparse"] != [code_default("sparse")]
