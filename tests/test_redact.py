"""What a remote client reads of the server's paths (issue 37 defect 9): the data directory
becomes ``<data>`` where it stands as a path, and nothing else in a message changes, however
short the directory's name."""
from __future__ import annotations

import os

import pytest

import polyindex
from polyindex.client.remote import Client
from polyindex.errors import Corrupt, NotFound
from polyindex.service.redact import Redactor
from polyindex.service.server import serve

NAMES = ["named", "fruit", "data", "a", "d"]  # collections named like the data directories


@pytest.mark.parametrize("data", ["d", "data", "a"])
def test_a_short_data_directory_name_leaves_words_alone(tmp_path, monkeypatch, frontend, data):
    monkeypatch.chdir(tmp_path)  # served as given on the command line: relative, one letter
    eng = polyindex.open(data)
    for name in NAMES:
        eng.create_collection(name, ["lexical"]).add([{"id": "x", "text": "hello"}])
    with pytest.raises(NotFound) as embedded:
        eng.collection("nope")
    eng.close()
    (seg,) = (tmp_path / data / "fruit" / "segments").iterdir()
    # damaged before the server starts (it opens its collections then, checking each file
    # once): it names the damaged file, inside its data dir
    with (seg / "docs.arrow").open("r+b") as f:
        f.write(b"garbage!")
    srv = serve(data, port=0, frontend=frontend)
    try:
        with Client(srv.address) as c:
            with pytest.raises(NotFound) as remote:
                c.collection("nope")
            with pytest.raises(Corrupt) as damaged:
                c.collection("fruit").query("hello")
    finally:
        srv.stop(grace=2)
    assert str(remote.value) == str(embedded.value) == \
        "collection 'nope' not found (have: a, d, data, fruit, named)"
    msg = str(damaged.value)
    assert msg.startswith(f"<data>/fruit/segments/{seg.name}/docs.arrow: checksum mismatch"), msg
    assert str(tmp_path) not in msg


@pytest.mark.parametrize("data", ["d", "data", "a"])
def test_every_spelling_of_the_directory_as_a_path_and_nothing_else(tmp_path, monkeypatch, data):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / data)  # realpath differs from the given path
    r = Redactor(data)
    absolute, real = str(tmp_path / data), str(tmp_path / "real")
    cases = {
        f"{absolute}/c/manifest.json: bad": "<data>/c/manifest.json: bad",
        f"cannot read {real}/c/x.arrow.": "cannot read <data>/c/x.arrow.",
        f"{data}/c/segments/s1: gone": "<data>/c/segments/s1: gone",
        f"data directory {absolute} is open read-only": "data directory <data> is open read-only",
        f"locked: '{real}'": "locked: '<data>'",
        f"mmap file://{absolute}/c/x.arrow failed": "mmap file://<data>/c/x.arrow failed",
        f"field 'year' of {data}: must be int (a, d, data, named)":
            f"field 'year' of {data}: must be int (a, d, data, named)",
        f"other paths: /x/{data}/y, {absolute}2/z, {real}.bak, my{data}/q":
            f"other paths: /x/{data}/y, {absolute}2/z, {real}.bak, my{data}/q",
    }
    for message, want in cases.items():
        assert r.text(message) == want, message
    clean = r.error(Corrupt(f"{absolute}/c/m.json: damaged (have: {data}, named)"))
    assert type(clean) is Corrupt
    assert str(clean) == f"<data>/c/m.json: damaged (have: {data}, named)"
