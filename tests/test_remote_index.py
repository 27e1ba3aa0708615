"""``polyindex index SRC --server HOST:PORT`` reads records as the local path does (issue 37
defect 10): CSV cells typed by the declared fields, bad records named by file and line, and
a first run that sends nothing leaves no collection behind. A real server on loopback, the
CLI in a subprocess."""
from __future__ import annotations

import pytest

from polyindex.client.remote import Client
from polyindex.service.server import serve

HEADER = "id,title,text,year\n"


@pytest.fixture
def server(tmp_path):
    srv = serve(tmp_path / "data", port=0, frontend="python")
    yield srv
    srv.stop(grace=2)


def test_csv_through_a_server_keeps_the_declared_types(tmp_path, server, cli):
    src = tmp_path / "docs.csv"
    src.write_text(HEADER + "c1,One,wing flutter,2022\nc2,Two,heat transfer,2019\n"
                   "c3,Three,no year,\n")
    r = cli("index", src, "--collection", "c", "--index", "lexical", "--field", "year:int",
            "--server", server.address, "--data", tmp_path / "data", "--no-progress", timeout=120)
    assert r.returncode == 0, r.stderr
    with Client(server.address) as c:
        coll = c.collection("c")
        assert coll.count() == 3
        hits = coll.query("wing heat year", filter={"year": {"gte": 2020}})
        assert [h.id for h in hits] == ["c1"]
        one, three = coll.get(["c1", "c3"])
        assert one.metadata["year"] == 2022 and type(one.metadata["year"]) is int
        assert "year" not in three.metadata  # an empty cell is no value, as locally


def test_a_bad_cell_is_named_by_file_and_line_and_the_new_collection_is_dropped(
        tmp_path, server, cli):
    src = tmp_path / "bad.csv"
    src.write_text(HEADER + "c1,One,wing flutter,2022\nc2,Two,heat transfer,twenty\n")
    r = cli("index", src, "--collection", "c", "--index", "lexical", "--field", "year:int",
            "--server", server.address, "--data", tmp_path / "data", "--no-progress", timeout=120)
    assert r.returncode == 2, r.stderr
    assert "bad.csv:3, id='c2', field 'year': 'twenty' is not an integer" in r.stderr, r.stderr
    assert "add()" not in r.stderr
    with Client(server.address) as c:
        assert "c" not in c.list_collections()  # the failed first run left nothing behind


def test_a_record_the_server_refuses_is_named_by_file_and_a_kept_collection_stays(
        tmp_path, server, cli):
    with Client(server.address) as c:
        c.create_collection("v", ["lexical", "dense@img:dim=2"], model=None)
        c.collection("v").add([{"id": "v0", "text": "kept", "vectors": {"img": [1.0, 0.0]}}])
    src = tmp_path / "vecs.jsonl"
    src.write_text('{"id": "v1", "text": "a", "vectors": {"img": [0.5, 0.5]}}\n'
                   '{"id": "v2", "text": "b", "vectors": {"img": [1.0, 2.0, 3.0]}}\n')
    r = cli("index", src, "--collection", "v", "--server", server.address, "--data",
            tmp_path / "data", "--no-progress",
            timeout=120)
    assert r.returncode == 2, r.stderr
    assert "vecs.jsonl" in r.stderr and "id='v2'" in r.stderr and "add()" not in r.stderr, r.stderr
    with Client(server.address) as c:  # all or nothing per batch; the existing collection stays
        assert c.collection("v").count() == 1
    src.write_text('{"id": "v1", "text": "a", "vectors": {"img": [0.0, 1.0]}}\n')
    r = cli("index", src, "--collection", "v", "--server", server.address, "--data",
            tmp_path / "data", "--no-progress", timeout=120)
    assert r.returncode == 0, r.stderr
    with Client(server.address) as c:  # the record's vector travels with it
        hits = c.collection("v").query(vector=[0.0, 1.0], using="img", k=1)
        assert [h.id for h in hits] == ["v1"]


def test_a_new_collection_gets_the_model_and_segment_size_asked_for(tmp_path, server, cli):
    src = tmp_path / "vecs.jsonl"
    src.write_text('{"id": "v1", "text": "a", "vector": [0.5, 0.5]}\n')
    r = cli("index", src, "--collection", "v", "--index", "dense:dim=2", "--model", "none",
            "--segment-size", "7", "--server", server.address, "--data", tmp_path / "data",
            "--no-progress", timeout=120)
    assert r.returncode == 0, r.stderr
    with Client(server.address) as c:
        info = c.collection("v").info()
        assert info["model"] is None and info["segment_size"] == 7 and info["documents"] == 1
