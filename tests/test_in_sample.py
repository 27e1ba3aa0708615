"""`eval` marks a profile whose shipped ranker was trained on the evaluated collection
("in-sample"): the shipped `general` ranker saw the ten shared collections' judgements, so its
score on one of them is not a result (issue 39)."""
import json

import pytest
from typer.testing import CliRunner

import polyindex
from polyindex.cli.in_sample import identities, in_sample
from polyindex.cli.main import app
from polyindex.rerank.registry import SHIPPED

pytestmark = pytest.mark.slow  # encodes with the embedding model

DOCS = [("d1", "wing flutter", "aeroelastic flutter of a wing at transonic speed"),
        ("d2", "boundary layer", "transition of the boundary layer at hypersonic speed"),
        ("d3", "heat transfer", "heat transfer to a blunt body in supersonic flow"),
        ("d4", "river fish", "fish of the river and the lake")]


def beir(folder):
    folder.mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in DOCS))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "wing flutter"}) + "\n"
                                          + json.dumps({"_id": "q2", "text": "heat flow"}) + "\n")
    (folder / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t1\n")
    return folder


def cli(*args):
    """The CLI's app run in this process: the embedding model loads once for the module."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res


def trained_on():
    return json.loads((SHIPPED / "general" / "ranker.json").read_text())["collections"]


def test_in_sample_by_name_or_source_folder(tmp_path):
    assert "cranfield" in trained_on() and "nfcorpus" in trained_on()
    eng = polyindex.open(tmp_path / "data")
    named = eng.create_collection("cranfield", ["lexical", "dense"])
    named.index(beir(tmp_path / "x" / "mine"))
    # the profiles with a shipped ranker only; hybrid has none
    assert in_sample(named, ["hybrid", "ltr"]) == {
        "ltr": {"model": "general", "trained_on": trained_on()}}
    by_source = eng.create_collection("c", ["lexical", "dense"])
    by_source.index(beir(tmp_path / "y" / "nfcorpus"))  # the name a training run used
    assert identities(by_source) == {"c", "nfcorpus"}
    assert set(in_sample(by_source, ["ltr"])) == {"ltr"}
    fresh = eng.create_collection("unseen", ["lexical", "dense"])
    fresh.index(beir(tmp_path / "z" / "mydocs"))
    assert in_sample(fresh, ["hybrid", "ltr"]) == {}


def test_eval_marks_in_sample_in_table_and_json(tmp_path):
    src = beir(tmp_path / "cranfield")
    data = tmp_path / "data"
    assert cli("index", src, "--data", data, "-c", "cranfield", "--no-progress").exit_code == 0
    args = ("eval", "--data", data, "-c", "cranfield", "--queries", src / "queries.jsonl",
            "--qrels", src / "qrels.tsv", "--profile", "all")
    p = cli(*args, "--json")
    assert p.exit_code == 0, p.output
    out = json.loads(p.stdout)
    assert set(out["in_sample"]) == {"ltr"} and out["in_sample"]["ltr"]["model"] == "general"
    assert "ltr" in out["results"] and "hybrid" in out["results"]
    p = cli(*args)
    assert p.exit_code == 0, p.output
    assert "ltr (in-sample)" in p.stdout and "hybrid (in-sample)" not in p.stdout
    assert "is not a result" in p.stdout


def test_query_without_profile_runs_the_default(tmp_path):
    from polyindex.query.profiles import DEFAULT
    src = beir(tmp_path / "docs")
    data = tmp_path / "data"
    assert cli("index", src, "--data", data, "-c", "c", "--no-progress").exit_code == 0
    base = ("query", "heat flow in a supersonic wing", "--data", data, "-c", "c")
    plain = cli(*base)
    assert plain.exit_code == 0, plain.output
    assert f"c · {DEFAULT} ·" in plain.stdout  # the table's title names the profile that ran
    got = json.loads(cli(*base, "--json").stdout)
    named = json.loads(cli(*base, "--profile", DEFAULT, "--json").stdout)
    assert got == named and [h["id"] for h in got][0] == "d3"
