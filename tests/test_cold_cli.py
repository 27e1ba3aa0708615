"""A cold ``polyindex query`` on a collection without dense loads none of the heavy libraries
(issue 38 part 3): the CLI's main runs in a fresh interpreter, which then reports the modules
it imported. (Its time is measured in bench/bench_cold_cli.py, not here.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

# torch, the model and LightGBM are seconds of a cold start; faiss and pandas a tenth each
# (pandas came through pyarrow's to_numpy and pyarrow.dataset). scipy is left out: numba
# imports scipy.linalg to find BLAS whenever a compiled kernel is loaded.
HEAVY = ("torch", "sentence_transformers", "transformers", "lightgbm", "ray", "faiss",
         "pandas", "sklearn")

RUN_MAIN = """
import json, sys
sys.argv = ["polyindex"] + json.loads(sys.argv[1])
from polyindex.cli.main import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def cold(args: list[str]) -> tuple[str, list[str]]:
    """The CLI's stdout and the modules its process imported."""
    proc = subprocess.run([sys.executable, "-c", RUN_MAIN, json.dumps(list(map(str, args)))],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), proc.stderr
    return proc.stdout, report["modules"]


def heavy(modules: list[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules} & set(HEAVY))


DOCS = [{"_id": "bl", "title": "Boundary layers", "text": "supersonic boundary layer transition"},
        {"_id": "rv", "title": "Rivers", "text": "water flows in rivers to the sea"},
        {"_id": "wg", "title": "Wings", "text": "lift of a wing at low speed"}]


@pytest.fixture(scope="module")
def collection(tmp_path_factory, cli):
    """``collection(name)``: the data folder after the CLI indexed three documents into
    ``name``: ``nomodel`` (``--index lexical --model none``) or ``withmodel`` (``--index
    lexical``: the default model stored, never loaded, as no kind encodes)."""
    folder = tmp_path_factory.mktemp("cold")
    src = folder / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in DOCS))
    data, made = folder / "data", set()

    def make(name: str):
        if name not in made:
            extra = ["--model", "none"] if name == "nomodel" else []
            done = cli("index", src, "--data", data, "-c", name, "--index", "lexical",
                       "--no-progress", *extra)
            assert done.returncode == 0, done.stderr
            made.add(name)
        return data
    return make


def check_lexical_query(data, name: str, profile: list[str]) -> None:
    out, modules = cold(["query", "boundary layer", "--data", data, "-c", name, *profile,
                         "--k", "2", "--json"])
    assert [h["id"] for h in json.loads(out)][:1] == ["bl"]
    assert heavy(modules) == []
    # no other kind (an online buffer's faiss-free ``dense.stack`` is there), no quality
    # model, no encoder, no filter machinery
    assert not [m for m in modules if m.startswith((
        "polyindex.index.dense.kind", "polyindex.index.multivector", "polyindex.index.sparse",
        "polyindex.index.tree", "polyindex.rerank.doc_quality", "polyindex.encode",
        "pyarrow.dataset"))]


def test_lexical_query_imports_no_heavy_library(collection):
    check_lexical_query(collection("nomodel"), "nomodel", ["--profile", "lexical"])


@pytest.mark.slow
@pytest.mark.parametrize("name,profile", [("nomodel", []), ("withmodel", ["--profile", "lexical"]),
                                          ("withmodel", [])])
def test_lexical_query_imports_no_heavy_library_any_way(collection, name, profile):
    """A collection with a model but no kind that encodes, and the default profile."""
    check_lexical_query(collection(name), name, profile)


@pytest.mark.slow
def test_the_check_sees_a_heavy_import(collection):
    """The same probe reports what a command does load: a filter needs pyarrow.dataset, which
    imports pandas, so the check above can fail."""
    out, modules = cold(["query", "boundary layer", "--data", collection("nomodel"), "-c",
                         "nomodel", "--profile", "lexical", "--filter", '{"id": "bl"}', "--json"])
    assert [h["id"] for h in json.loads(out)] == ["bl"]
    assert "pyarrow.dataset" in modules
