"""Declaring a metadata field on an existing collection (issue 37 defect 12). A filter reads a
declared field's typed column, which documents already stored were written without; so a
field is declared when its collection is created, and asking an existing collection for a
new field (or a new type) is refused with what to do, before anything is written. Asking for
a field as it is declared is a no-op."""
from __future__ import annotations

import pytest

import polyindex
from polyindex.client.remote import Client
from polyindex.errors import InvalidArgument
from polyindex.service.server import serve

DOCS = [{"id": "c1", "title": "One", "text": "wing flutter", "year": 2022, "lang": "en"},
        {"id": "c2", "title": "Two", "text": "heat transfer", "year": 2019, "lang": "fr"}]
MORE = "id,title,text,year,lang\nc3,Three,wing tips,2023,en\n"


def _index(cli, src, *args):
    return cli("index", src, "--collection", "c", "--index", "lexical", "--no-progress", *args,
               timeout=120)


@pytest.mark.parametrize("remote", [False, True], ids=["local", "server"])
def test_index_field_on_an_existing_collection(tmp_path, cli, remote):
    data = tmp_path / "data"
    (tmp_path / "more.csv").write_text(MORE)
    with polyindex.open(data) as eng:  # the collection as a first `index --field year:int` left it
        eng.create_collection("c", ["lexical"], fields={"year": "int"}).add(DOCS)
    srv = serve(data, port=0, frontend="python") if remote else None
    where = ("--data", data) + (("--server", srv.address) if remote else ())
    try:
        new = _index(cli, tmp_path / "more.csv", *where, "--field", "lang:string")
        assert new.returncode == 2, new.stderr
        assert "collection 'c' exists without field 'lang' (--field gave lang:string; " \
               "declared: year:int): fields are declared when a collection is created" in \
               new.stderr, new.stderr
        retyped = _index(cli, tmp_path / "more.csv", *where, "--field", "year:string")
        assert retyped.returncode == 2, retyped.stderr
        assert "field 'year' of collection 'c' is declared int; --field gave year:string" in \
            retyped.stderr, retyped.stderr
        same = _index(cli, tmp_path / "more.csv", *where, "--field", "year:int")
        assert same.returncode == 0, same.stderr  # as declared: a no-op, the file is indexed
        with (Client(srv.address) if remote else polyindex.open(data, readonly=True)) as c:
            coll = c.collection("c")
            assert coll.count() == 3  # the refused runs wrote nothing
            assert sorted(h.id for h in coll.query("wing heat", filter={"year": {"gte": 2020}})) \
                == ["c1", "c3"]
    finally:
        if srv is not None:
            srv.stop(grace=2)


def test_create_collection_exist_ok_with_other_fields(tmp_path):
    """The SDK's (and CreateCollection's) way to ask: ``exist_ok`` with fields."""
    data = tmp_path / "data"
    with polyindex.open(data) as eng:
        eng.create_collection("c", ["lexical"], fields={"year": "int"})
        assert eng.create_collection("c", ["lexical"], fields={"year": "int"},
                                     exist_ok=True).config.fields == {"year": "int"}
        with pytest.raises(InvalidArgument, match="exists without field 'lang'"):
            eng.create_collection("c", ["lexical"], fields={"lang": "string"}, exist_ok=True)
    srv = serve(data, port=0, frontend="python")
    try:
        with Client(srv.address) as c:
            assert c.create_collection("c", ["lexical"], fields={"year": "int"},
                                       exist_ok=True).fields == {"year": "int"}
            with pytest.raises(InvalidArgument, match="'year' of collection 'c' is declared int"):
                c.create_collection("c", ["lexical"], fields={"year": "float"}, exist_ok=True)
    finally:
        srv.stop(grace=2)
