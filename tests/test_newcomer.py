"""The newcomer's list (issue 41 part 6): what a new user trips over, each checked here."""
from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

import polyindex
from polyindex.ingest.progress_log import LogProgress

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


@pytest.fixture
def pi(capsys, monkeypatch):
    """``pi(*args)`` -> (exit code, stdout, stderr) of ``polyindex ARGS`` run in this process
    (the CLI's own ``main``: its error lines and exit codes), seconds faster than a child."""
    from polyindex.cli.main import main

    def run(*args):
        monkeypatch.setattr("sys.argv", ["polyindex", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        got = capsys.readouterr()
        return code, got.out, got.err
    return run


CRANFIELD = pytest.mark.skipif(not (DATA / "cranfield").is_dir(),
                               reason="../shared/data/cranfield not present")


# -- progress as log lines where stderr is not a terminal ---------------------------------------

def test_log_progress_writes_rate_and_eta_lines_periodically():
    stream = io.StringIO()
    with LogProgress("docs", every=0.02, stream=stream) as bar:
        task = bar.add_task("indexing d.jsonl", total=1000)
        bar.advance(task, 250)
        deadline = time.monotonic() + 10
        while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # lines come from the timer thread, not from advance
        middle = stream.getvalue().splitlines()
        bar.advance(task, 750)
    lines = stream.getvalue().splitlines()
    assert len(middle) >= 2
    assert middle[0].startswith("progress: indexing d.jsonl: 250/1,000 docs (25%)")
    assert "docs/s" in middle[0] and "ETA" in middle[0]
    assert lines[-1].startswith("progress: indexing d.jsonl: 1,000/1,000 docs (100%)")
    assert "ETA" not in lines[-1]  # done


def test_index_into_a_pipe_prints_progress_lines(tmp_path, cli, corpus, setting, monkeypatch):
    src = tmp_path / "d.jsonl"
    corpus.make(src, 1500, seed=3)
    monkeypatch.setenv("POLYINDEX_PROGRESS_SECONDS", "0.05")  # the child reads it
    res = cli("index", src, "--data", tmp_path / "D", "-c", "c", "--index", "lexical",
              "--model", "none", "--segment-size", "500")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ")]
    records = [ln for ln in lines if "indexing d.jsonl" in ln]
    assert records and records[-1].startswith("progress: indexing d.jsonl: 1,500/1,500 docs")
    assert any("building lexical" in ln for ln in lines)
    assert "docs/s" in records[-1]


# -- eval: measures in any case, latency, paired tests against the first ------------------------

def _run_file(path, ranks: dict[str, int]):
    """A run where query q's relevant document ``rel-q`` sits at rank ``ranks[q]``."""
    lines = []
    for q, r in ranks.items():
        docs = [f"other-{q}-{i}" for i in range(r - 1)] + [f"rel-{q}"]
        lines += [f"{q} Q0 {d} {i + 1} {10 - i} t\n" for i, d in enumerate(docs)]
    path.write_text("".join(lines))
    return path


def test_eval_compares_runs_with_a_paired_t_test_against_the_first(tmp_path, pi):
    from scipy.stats import ttest_rel
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" +
                     "".join(f"q{i}\trel-q{i}\t1\n" for i in range(4)))
    a = _run_file(tmp_path / "a.trec", {f"q{i}": 2 for i in range(4)})
    b = _run_file(tmp_path / "b.trec", {"q0": 1, "q1": 1, "q2": 1, "q3": 2})
    code, stdout, stderr = pi("eval", "--run", a, "--run", b, "--qrels", qrels, "-m", "rr@10",
                              "-m", "ndcg@10", "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert list(got["results"][str(a)]) == ["MRR@10", "nDCG@10"]  # lower case accepted
    assert got["baseline"] == str(a)
    test = got["paired_t_test"][str(b)]["MRR@10"]
    want = ttest_rel([1, 1, 1, 0.5], [0.5] * 4)
    assert test["p"] == pytest.approx(want.pvalue) and test["t"] == pytest.approx(3.0)
    assert (test["wins"], test["losses"]) == (3, 0)
    _, table, _ = pi("eval", "--run", a, "--run", b, "--qrels", qrels, "-m", "RR@10")
    assert "paired t-test against" in table and f"{want.pvalue:.3f}" in table
    code, _, stderr = pi("eval", "--run", a, "--qrels", qrels, "-m", "ndgc@10")
    assert code == 2 and "did you mean nDCG@10" in stderr


@pytest.mark.slow
@CRANFIELD
def test_eval_of_two_profiles_has_latency_and_significance(tmp_path, cli):
    from scipy.stats import ttest_rel

    from polyindex.cli.evaluate import per_query
    folder = DATA / "cranfield"
    data = tmp_path / "D"
    assert cli("index", folder, "--data", data, "-c", "cran", "--index", "lexical", "--model",
               "none", "--no-progress").returncode == 0
    runs = tmp_path / "runs"
    res = cli("eval", "--data", data, "-c", "cran", "--queries", folder / "queries.jsonl",
              "--qrels", folder / "qrels" / "test.tsv", "-p", "lexical", "-p", "lexical-prf",
              "--run-dir", runs, "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert set(got["latency_ms"]) == {"lexical", "lexical-prf"}
    assert all(ms > 0 for ms in got["latency_ms"].values())
    from polyindex.ingest.sources import read_qrels
    qrels = read_qrels(folder / "qrels" / "test.tsv")
    base = per_query(runs / "cran.lexical.trec", qrels)["nDCG@10"]
    prf = per_query(runs / "cran.lexical-prf.trec", qrels)["nDCG@10"]
    qs = sorted(base)
    want = ttest_rel([prf[q] for q in qs], [base[q] for q in qs]).pvalue
    assert got["paired_t_test"]["lexical-prf"]["nDCG@10"]["p"] == pytest.approx(want)


# -- query: the profile it ran, tidy JSON, filters, "did you mean" ------------------------------

@pytest.fixture
def lexical_data(tmp_path):
    """A lexical-only collection 'books' (no model) with a declared int field 'year'."""
    data = tmp_path / "D"
    eng = polyindex.open(data)
    coll = eng.create_collection("books", ["lexical"], model=None, fields={"year": "int"})
    coll.add([{"id": "a", "title": "Rivers", "text": "river delta", "year": 1990},
              {"id": "b", "text": "river mouth", "year": 1995},
              {"id": "c", "title": "Hills", "text": "hill top"}])
    eng.close()
    return data


def test_query_table_names_the_profile_it_ran(lexical_data, pi):
    code, out, err = pi("query", "river", "--data", lexical_data, "-c", "books")
    assert code == 0, err
    assert "books · lexical · 'river'" in out  # the collection's default, by name
    _, out, _ = pi("query", "river", "--data", lexical_data, "-c", "books", "-p", "lexical-prf")
    assert "books · lexical-prf · 'river'" in out


def test_json_hits_leave_out_empty_fields(lexical_data, pi):
    code, out, err = pi("query", "river", "--data", lexical_data, "-c", "books", "--json",
                        "--with-text", "--with-metadata")
    assert code == 0, err
    hits = {h["id"]: h for h in json.loads(out)}
    assert hits["a"]["title"] == "Rivers" and hits["a"]["metadata"] == {"year": 1990}
    assert set(hits["b"]) == {"rank", "id", "score", "text", "metadata"}  # no empty title
    _, out, _ = pi("query", "river", "--data", lexical_data, "-c", "books", "--json")
    assert all("text" not in h and "metadata" not in h for h in json.loads(out))


def test_filter_syntax_of_the_readme_runs(lexical_data):
    """Every form README's filter section shows, against the documents they should match."""
    eng = polyindex.open(lexical_data, readonly=True)
    coll = eng.collection("books")

    def ids(flt):
        return sorted(h.id for h in coll.query("river hill", k=10, filter=flt))
    assert ids({"year": 1990}) == ["a"]                                   # equality
    assert ids({"year": {"eq": 1995}}) == ["b"]
    assert ids({"year": {"ne": 1990}}) == ["b"]                           # a missing value never matches
    assert ids({"year": {"gte": 1991, "lt": 2000}}) == ["b"]              # a range
    assert ids({"year": {"in": [1990, 1995]}}) == ["a", "b"]
    # a document without the field: no comparison matches it, nor the comparison's not;
    # in never matches it, nin (and the not of in) does (Arrow's is_in)
    assert ids({"year": {"nin": [1990]}}) == ["b", "c"]
    assert ids({"not": {"year": {"in": [1990]}}}) == ["b", "c"]
    assert ids({"or": [{"year": 1990}, {"id": "c"}]}) == ["a", "c"]
    assert ids({"not": {"year": 1990}}) == ["b"]
    assert ids({"and": [{"year": {"gt": 1980}}, {"not": {"id": "a"}}]}) == ["b"]
    assert ids({"id": {"in": ["a", "c"]}}) == ["a", "c"]
    eng.close()


@pytest.mark.parametrize("flt, says", [
    ('{"year": [1990, 1995]}', 'use in: {"year": {"in": [1990, 1995]}}'),
    ('{"year": {"eq": [1990]}}', "(to match any of several values: in)"),
    ('{"year": {"ne": [1990]}}', "(to exclude several values: nin)"),
    ('{"yaer": 1990}', "(did you mean 'year'?)"),
    ('{"year": {"gtee": 1990}}', "(did you mean 'gte'?)"),
])
def test_filter_mistakes_say_what_to_write(lexical_data, pi, flt, says):
    code, _, err = pi("query", "river", "--data", lexical_data, "-c", "books", "--filter", flt)
    assert code == 2 and says in err, err


def test_unknown_profile_and_collection_get_a_suggestion(lexical_data, pi):
    code, _, err = pi("query", "river", "--data", lexical_data, "-c", "books", "-p", "lexcial")
    assert code == 2 and "unknown rank profile 'lexcial' (did you mean 'lexical'?)" in err
    code, _, err = pi("query", "river", "--data", lexical_data, "-c", "boks")
    assert code == 2 and "collection 'boks' not found (did you mean 'books'?)" in err
    src = lexical_data.parent / "more.jsonl"
    src.write_text('{"_id": "d", "text": "lake", "year": 2001}\n')
    code, _, err = pi("index", src, "--data", lexical_data, "-c", "books", "--field", "yera:int",
                      "--no-progress")
    assert code == 2 and "exists without field 'yera' (did you mean 'year'?)" in err, err


# -- .hdf5 files marked distance=angular --------------------------------------------------------

def _angular_file(path, x, distance="angular"):
    h5py = pytest.importorskip("h5py")  # the optional extra: without it, nothing to check
    with h5py.File(path, "w") as f:
        f["train"], f["test"] = x, x[:2]
        f.attrs["distance"] = distance
    return path


def test_an_angular_hdf5_file_is_indexed_by_cosine(tmp_path, pi):
    import numpy as np
    rng = np.random.default_rng(7)
    # lengths spread over two orders of magnitude: inner product and cosine rank differently
    x = (rng.normal(size=(200, 8)) * rng.uniform(0.1, 10, size=(200, 1))).astype(np.float32)
    src = _angular_file(tmp_path / "glove-8-angular.hdf5", x)
    data = tmp_path / "D"
    code, _, err = pi("index", src, "--data", data, "-c", "g", "--index", "dense:Flat",
                      "--model", "none", "--no-progress")
    assert code == 0, err
    assert "marked distance=angular: indexing its vectors with 'dense:metric=cosine,Flat'" in err
    eng = polyindex.open(data, readonly=True)
    coll = eng.collection("g")
    assert coll.kinds["dense"].metric == "cosine"
    q = rng.normal(size=8).astype(np.float32)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    want = [str(i) for i in np.argsort(-(unit @ (q / np.linalg.norm(q))), kind="stable")[:10]]
    assert [h.id for h in coll.query(vector=q.tolist(), k=10)] == want
    eng.close()
    # an existing collection ranking by inner product: indexed as asked, with a warning
    eng = polyindex.open(data)
    eng.create_collection("ip", ["dense:Flat"], model=None)
    eng.close()
    code, _, err = pi("index", src, "--data", data, "-c", "ip", "--no-progress")
    assert code == 0, err
    assert "warning: glove-8-angular.hdf5 is marked distance=angular, but collection 'ip' " \
           "ranks its vectors by metric=ip" in err


def test_reading_hdf5_without_h5py_names_the_package(tmp_path, monkeypatch):
    import sys

    from polyindex.errors import InvalidArgument
    from polyindex.ingest.vector_files import load_matrix
    monkeypatch.setitem(sys.modules, "h5py", None)  # as where it is not installed
    (tmp_path / "v.hdf5").write_bytes(b"")
    with pytest.raises(InvalidArgument) as e:
        load_matrix(tmp_path / "v.hdf5", "v.hdf5")
    assert "reading HDF5 needs h5py: pip install 'h5py" in str(e.value)
    assert "polyindex[hdf5]" not in str(e.value)  # fails where polyindex is not on the index


# -- info, exit codes ---------------------------------------------------------------------------

def test_info_shows_no_model_for_lexical_only_and_vector_fields_readably(tmp_path, pi):
    data = tmp_path / "D"
    eng = polyindex.open(data)
    eng.create_collection("lex", ["lexical"])  # the default model, which nothing runs
    eng.create_collection("img", ["lexical", "dense@image:dim=4,metric=cosine,Flat"],
                          model=None)
    eng.close()
    code, out, err = pi("info", "--data", data, "-c", "lex")
    assert code == 0, err
    assert re.search(r"\n  model +none \(no index encodes text\)\n", out), out
    _, out, _ = pi("info", "--data", data, "-c", "img")
    assert re.search(r"\n  your vector fields +image: dim 4, cosine, index dense@image\n", out)
    assert "{" not in out and "'" not in out  # no Python reprs
    _, out, _ = pi("info", "--data", data, "-c", "lex", "--json")
    assert json.loads(out)["encodes_text"] is False


@pytest.mark.parametrize("args, code, status", [
    (("query", "x", "-c", "nope"), 2, "NOT_FOUND"),                     # a name not there
    (("query", "x", "-c", "books", "--k", "0"), 2, "INVALID_ARGUMENT"),
    (("query", "x", "-c", "books", "--no-such-option"), 2, None),         # usage (click)
    (("compact", "-c", "books"), 1, "FAILED_PRECONDITION"),               # a writer holds it
])
def test_exit_codes_follow_one_convention(lexical_data, pi, args, code, status):
    """README "Exit codes": 2 for what the user fixes by changing the command, 1 for the
    machine's or the data's state."""
    argv = [*args[:1], *args[1:2], "--data", lexical_data, *args[2:]] if args[0] == "query" \
        else [args[0], "--data", lexical_data, *args[1:]]
    holder = polyindex.open(lexical_data) if status == "FAILED_PRECONDITION" else None
    try:
        got, _, err = pi(*argv)
    finally:
        if holder is not None:
            holder.close()
    assert got == code, err
    if status:
        assert err.startswith(f"error ({status}): ")


def test_tune_bm25_takes_a_measure_in_any_case(lexical_data):
    from polyindex.cli.tune import Grid, tune
    eng = polyindex.open(lexical_data)
    coll = eng.collection("books")
    queries = [("q1", "river delta"), ("q2", "hill"), ("q3", "river mouth")]
    qrels = {"q1": {"a": 1}, "q2": {"c": 1}}
    report = tune(coll, queries, qrels, test_qrels={"q3": {"b": 1}}, measure="ndcg@10",
                  grid=Grid(variants=("bm25",), k1=(1.2,), b=(0.75,)), store=False)
    assert report["measure"] == "nDCG@10"
    with pytest.raises(polyindex.InvalidArgument, match="did you mean nDCG@10"):
        tune(coll, queries, qrels, measure="ndgc@10", grid=Grid(variants=("bm25",)))
    eng.close()
