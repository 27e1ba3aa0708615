"""Data operations on the command line (count, delete --filter, scroll, export; --data and
--server), the export format read back by ``index`` (reserved columns, a model's stored
embeddings) and its errors. The SDK's behaviour on every implementation is in
tests/test_client_parity.py."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import polyindex
from polyindex import InputError
from polyindex.cli.main import app
from polyindex.ingest.export import EMBEDDING_PREFIX, METADATA_COLUMN, export
from polyindex.service.server import serve

DOCS = [{"id": f"d{i}", "title": f"Title {i}", "text": f"document number {i} about "
         + ("wings" if i % 2 else "cakes"), "year": 1990 + i, "extra": {"i": i}}
        for i in range(40)]


def _cli(*args):
    """(exit code, output); an error's exit code and line as ``polyindex`` prints them (2
    for bad input: ``cli.main.main``), the app run in this process."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    if isinstance(res.exception, polyindex.PolyindexError):
        return (2 if isinstance(res.exception, polyindex.InvalidArgument) else 1,
                f"error: {res.exception}")
    return res.exit_code, res.output


@pytest.fixture
def data(tmp_path):
    eng = polyindex.open(tmp_path / "data")
    eng.create_collection("c", ["lexical"], fields={"year": "int"}).add(DOCS)
    eng.close()
    return tmp_path / "data"


def test_cli_count_scroll_delete_export_and_index_back(data, tmp_path):
    code, out = _cli("count", "--data", data, "-c", "c", "--filter", '{"year": {"gte": 2020}}',
                     "--json")
    assert code == 0 and json.loads(out)["count"] == 10
    code, out = _cli("scroll", "--data", data, "-c", "c", "--limit", 15, "--fields", "year",
                     "--json")
    page = json.loads(out)
    assert code == 0 and len(page["documents"]) == 15 and page["cursor"]
    assert all(set(d["metadata"]) == {"year"} for d in page["documents"])
    code, out = _cli("scroll", "--data", data, "-c", "c", "--limit", 100, "--cursor",
                     page["cursor"], "--json")
    rest = json.loads(out)
    assert rest["cursor"] is None and len(rest["documents"]) == 25
    assert {d["id"] for d in page["documents"] + rest["documents"]} == {d["id"] for d in DOCS}
    code, out = _cli("scroll", "--data", data, "-c", "c", "--limit", 2)
    assert code == 0 and "next page: --cursor" in out
    code, out = _cli("delete", "--data", data, "-c", "c")
    assert code == 2 and "--filter JSON is required" in out
    code, out = _cli("delete", "--data", data, "-c", "c", "--filter", '{"year": {"lt": 2000}}')
    assert code == 0 and "deleted 10 documents" in out
    code, out = _cli("count", "--data", data, "-c", "c", "--filter", '{"year": [1, 2]}')
    assert code == 2
    path = tmp_path / "c.parquet"
    code, out = _cli("export", "--data", data, "-c", "c", "--to", path, "--json")
    assert code == 0 and json.loads(out)["exported"] == 30
    code, out = _cli("index", path, "--data", tmp_path / "back", "-c", "c", "--index",
                     "lexical", "--field", "year:int", "--no-progress")
    assert code == 0, out
    a, b = polyindex.open(data, readonly=True), polyindex.open(tmp_path / "back", readonly=True)
    every = [d["id"] for d in DOCS]
    assert a.collection("c").get(every) == b.collection("c").get(every)
    assert b.collection("c").count() == 30
    a.close()
    b.close()


def test_cli_export_through_a_server(data, tmp_path):
    srv = serve(data, port=0)
    try:
        path = tmp_path / "via-server.parquet"
        code, out = _cli("export", "--server", srv.address, "-c", "c", "--to", path)
        assert code == 0 and "exported 40 documents" in out
        code, out = _cli("count", "--server", srv.address, "-c", "c", "--filter",
                         '{"year": {"lt": 1995}}')
        assert code == 0 and out.strip() == "5"
        code, out = _cli("delete", "--server", srv.address, "-c", "c", "--filter",
                         '{"year": {"lt": 1995}}', "--json")
        assert code == 0 and json.loads(out)["deleted"] == 5
    finally:
        srv.stop(grace=2)
    table = pq.read_table(path)
    assert table.num_rows == 40 and table.column_names[:4] == ["id", "title", "text", "year"]
    extra = [json.loads(x) for x in table.column(METADATA_COLUMN).to_pylist()]
    assert sorted(e["extra"]["i"] for e in extra) == list(range(40))
    code, out = _cli("export", "--data", data, "--server", "127.0.0.1:1", "-c", "c", "--to", path)
    assert code == 2 and "one of them" in out


def test_export_refuses_a_name_that_is_not_parquet(data, tmp_path):
    eng = polyindex.open(data)
    try:
        with pytest.raises(polyindex.InvalidArgument, match=r"\*\.parquet"):
            eng.collection("c").export(tmp_path / "out.csv")
    finally:
        eng.close()


def test_bad_metadata_json_is_located(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"],
                             METADATA_COLUMN: ['{"k": 1}', "[1, 2]"],
                             EMBEDDING_PREFIX + "dense": [[0.5], [0.25]]}), path)
    eng = polyindex.open(tmp_path / "data")
    try:
        coll = eng.create_collection("c", ["lexical"])
        with pytest.raises(InputError,
                           match=r"bad.parquet:2.*_polyindex.metadata_json.*JSON object"):
            coll.index(path)
        coll.index(path, skip_invalid=True)
        got = coll.get(["a"])[0]
        assert got.metadata == {"k": 1}  # the embedding column is not metadata
    finally:
        eng.close()


@pytest.mark.slow
def test_a_models_embeddings_are_exported_and_encoded_again(tmp_path):
    """A collection that encodes its text: the export carries the model's vectors (a column
    ``index`` leaves out), and indexing it back encodes the same vectors."""
    eng = polyindex.open(tmp_path / "data")
    try:
        src = eng.create_collection("src", ["lexical", "dense"], dtype="float32",
                                    fields={"year": "int"})
        src.add(DOCS[:12])
        path = tmp_path / "m.parquet"
        assert src.export(path) == 12
        table = pq.read_table(path)
        assert EMBEDDING_PREFIX + "dense" in table.column_names
        back = eng.create_collection("back", ["lexical", "dense"], dtype="float32",
                                     fields={"year": "int"})
        back.index(path)
        every = [d["id"] for d in DOCS[:12]]
        assert back.get(every) == src.get(every)
        for a, b in zip(src.get(every, with_vectors=True), back.get(every, with_vectors=True)):
            assert np.allclose(a.vectors["dense"], b.vectors["dense"], atol=1e-5)
        stored = np.stack(table.column(EMBEDDING_PREFIX + "dense").to_numpy(zero_copy_only=False))
        first = src.get([table.column("id")[0].as_py()], with_vectors=True)[0]
        assert np.array_equal(stored[0].astype(np.float32), first.vectors["dense"])
        for q in ("wings", "cakes"):
            assert [h.id for h in src.query(q, profile="dense", k=5)] == \
                [h.id for h in back.query(q, profile="dense", k=5)]
    finally:
        eng.close()


def test_an_optional_vector_field_exports_null_rows_and_indexes_back(tmp_path):
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((20, 6)).astype(np.float32)
    eng = polyindex.open(tmp_path / "data")
    try:
        indexes = ["lexical", "dense@img:dim=6,optional,Flat"]
        src = eng.create_collection("src", indexes, model=None)
        src.add([{"id": f"d{i}", "text": f"t {i}",
                  **({"vectors": {"img": vecs[i]}} if i % 3 else {})} for i in range(20)])
        path = tmp_path / "o.parquet"
        src.export(path)
        col = pq.read_table(path).column("vector.img")
        assert col.null_count == 7  # d0, d3, ..., d18 have no image
        back = eng.create_collection("back", indexes, model=None)
        back.index(path)
        every = [f"d{i}" for i in range(20)]
        for a, b in zip(src.get(every, with_vectors=True), back.get(every, with_vectors=True)):
            assert sorted(a.vectors) == sorted(b.vectors)
            assert all(np.array_equal(a.vectors[f], b.vectors[f]) for f in a.vectors)
        assert [h.id for h in src.query(vector=vecs[4], using="img", k=5)] == \
            [h.id for h in back.query(vector=vecs[4], using="img", k=5)]
    finally:
        eng.close()
