"""The web console (issue 44) over HTTP, against a real gRPC server and its real client: the
token (401 without it, as UNAUTHENTICATED), the Host check, the files it may read, what the
pages' JSON holds against the SDK's own answers, and `polyindex eval --plot`. The pages in a
real browser: tests/test_console_browser.py."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import start_server, stop_server

import polyindex
from polyindex.client.remote import Client
from polyindex.console.files import Files
from polyindex.console.sampler import Sampler
from polyindex.console.serve import client_address, start_console
from polyindex.errors import InvalidArgument
from polyindex.service.server import serve

CRANFIELD = Path(polyindex.__file__).parent / "cli" / "demo_data" / "cranfield"
TOKEN = "s3cret-token"


def _cranfield(data: Path, n: int = 300) -> None:
    """A lexical collection (no model) of the shipped Cranfield's first n documents."""
    recs = [json.loads(line) for line in (CRANFIELD / "corpus.jsonl").open()][:n]
    eng = polyindex.open(data)
    eng.create_collection("cran", ["lexical"], model=None).add(
        [{"id": r["_id"], "title": r.get("title", ""), "text": r["text"]} for r in recs])
    eng.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """A server with a token over a Cranfield collection and its console: (console, server
    address, data dir)."""
    root = tmp_path_factory.mktemp("console")
    data = root / "data"
    _cranfield(data)
    evals = data / "evals"
    evals.mkdir()
    for name in ("queries.jsonl",):
        (evals / name).write_bytes((CRANFIELD / name).read_bytes())
    (evals / "test.tsv").write_bytes((CRANFIELD / "qrels" / "test.tsv").read_bytes())
    (root / "outside.tsv").write_text("query-id\tcorpus-id\tscore\n1\t1\t1\n")
    (evals / "link.tsv").symlink_to(root / "outside.tsv")
    srv = serve(data, port=0, token=TOKEN, frontend="python")
    con = start_console(srv.address, TOKEN, root=data, latency=srv.metrics.query_latency)
    yield con, srv.address, data
    con.stop()
    srv.stop()


def _get(url: str, headers: dict | None = None):
    """(status, headers, body) of a GET; redirects are not followed."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def _api(con, path: str, params=(), token: str | None = TOKEN):
    url = con.url.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
    status, _, body = _get(url, {"Authorization": f"Bearer {token}"} if token else {})
    return status, json.loads(body)


def test_without_the_token_every_page_and_api_answers_401(console):
    con, _, _ = console
    for path in ("/", "/search?collection=cran&q=flow", "/compare", "/evaluate"):
        status, headers, body = _get(con.url.rstrip("/") + path)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert b"token" in body and b"cran" not in body
    status, body = _api(con, "/api/search", {"collection": "cran", "q": "flow"}, token=None)
    assert (status, body["status"]) == (401, "UNAUTHENTICATED")
    status, body = _api(con, "/api/overview", token="wrong")
    assert status == 401
    # the page's files carry no data and load before the token is given
    assert _get(con.url + "static/console.js")[0] == 200


def test_the_token_in_a_link_becomes_a_session_cookie(console):
    con, _, _ = console
    status, _, _ = _get(con.url + "search?collection=cran&q=flow&token=wrong")
    assert status == 401
    status, headers, _ = _get(con.url + "search?collection=cran&q=flow&token=" + TOKEN)
    assert status == 303 and headers["Location"] == "/search?collection=cran&q=flow"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    session = cookie.split(";", 1)[0]
    status, _, body = _get(con.url + "api/overview", {"Cookie": session})
    assert status == 200 and json.loads(body)["collections"][0]["name"] == "cran"
    assert _get(con.url + "api/overview", {"Cookie": session[:-1] + "x"})[0] == 401
    # the redirect stays on the console's own pages
    for path in ("//evil.example/x", "/..//evil.example"):
        status, headers, _ = _get(con.url.rstrip("/") + path + "?token=" + TOKEN)
        assert status == 303 and headers["Location"] == "/"


def test_a_foreign_host_header_is_refused_on_loopback(console):
    con, _, _ = console
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert _get(con.url + "api/overview", {**auth, "Host": "evil.example:80"})[0] == 421
    assert _get(con.url + "api/overview", {**auth, "Host": f"localhost:{con.port}"})[0] == 200


def test_static_files_stay_in_their_folder(console):
    con, _, _ = console
    for path in ("static/../http.py", "static/%2e%2e/http.py", "static/vendor/../../api.py"):
        assert _get(con.url + path)[0] == 404
    status, _, body = _get(con.url + "static/vendor/chart.umd.min.js")
    assert status == 200 and b"Chart.js v4" in body[:200]


def test_search_answers_what_the_client_gets(console):
    con, address, _ = console
    status, body = _api(con, "/api/search", {"collection": "cran", "q": "boundary layer flow",
                                             "profile": "lexical", "k": "10"})
    assert status == 200
    with Client(address, token=TOKEN) as client:
        want = client.collection("cran").query("boundary layer flow", profile="lexical", k=10,
                                               explain=True, with_text=True)
    assert [(h["id"], h["score"]) for h in body["hits"]] == [(h.id, h.score) for h in want]
    assert [h["explain"] for h in body["hits"]] == [h.explain for h in want]
    assert body["hits"][0]["title"] == want[0].title
    status, body = _api(con, "/api/search", {"collection": "cran", "q": "x", "k": "0"})
    assert status == 400 and "k must be in 1..10000" in body["error"]
    status, body = _api(con, "/api/search", {"collection": "nope", "q": "x"})
    assert (status, body["status"]) == (404, "NOT_FOUND")
    status, body = _api(con, "/api/search", {"collection": "cran", "q": "x", "filter": "{"})
    assert status == 400 and "filter is not valid JSON" in body["error"]


def test_compare_marks_the_documents_that_moved(console):
    con, address, _ = console
    q = "boundary layer flow"
    status, body = _api(con, "/api/compare", {"collection": "cran", "q": q, "a": "lexical",
                                              "b": "lexical-prf"})
    assert status == 200
    with Client(address, token=TOKEN) as client:
        coll = client.collection("cran")
        a = [h.id for h in coll.query(q, profile="lexical", k=10)]
        b = [h.id for h in coll.query(q, profile="lexical-prf", k=10)]
    assert [h["id"] for h in body["a"]] == a and [h["id"] for h in body["b"]] == b
    ra = {i: r for r, i in enumerate(a, 1)}
    rb = {i: r for r, i in enumerate(b, 1)}
    want = {i: {"a": ra.get(i), "b": rb.get(i)} for i in {*a, *b} if ra.get(i) != rb.get(i)}
    assert want and body["moved"] == want  # RM3 moves some: the test can fail


def test_evaluation_reads_only_under_its_root(tmp_path):
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "sub" / "q.jsonl").write_text("{}\n")
    (tmp_path / "root" / "segments").mkdir()
    (tmp_path / "root" / "segments" / "x.tsv").write_text("")
    (tmp_path / "secret.tsv").write_text("")
    (tmp_path / "root" / "out.tsv").symlink_to(tmp_path / "secret.tsv")
    files = Files(tmp_path / "root")
    assert files.listing() == ["sub/q.jsonl"]  # no collection insides, no link out
    assert files.resolve("sub/q.jsonl", "queries") == (tmp_path / "root/sub/q.jsonl").resolve()
    for bad in ("../secret.tsv", "out.tsv", "sub/../../secret.tsv", str(tmp_path / "secret.tsv")):
        with pytest.raises(InvalidArgument, match="outside the console's root") as e:
            files.resolve(bad, "qrels")
        assert str(tmp_path) not in str(e.value).replace(bad, "")  # never the server's path
    with pytest.raises(InvalidArgument, match="no such file"):
        files.resolve("sub/none.tsv", "qrels")


EVAL = [("collection", "cran"), ("queries", "evals/queries.jsonl"), ("qrels", "evals/test.tsv"),
        ("profile", "lexical"), ("profile", "lexical-prf"), ("measure", "nDCG@10"),
        ("measure", "R@100"), ("k", "100")]


def test_evaluate_refuses_files_outside_its_root_and_unknown_profiles(console):
    con, _, _ = console
    for bad, why in ((("qrels", "../outside.tsv"), "outside the console's root"),
                     (("qrels", "evals/link.tsv"), "outside the console's root"),
                     (("queries", "/etc/passwd"), "outside the console's root"),
                     (("profile", "nope"), "nope")):
        status, body = _api(con, "/api/eval", [p for p in EVAL if p[0] != bad[0]] + [bad])
        assert status in (400, 404) and why in body["error"], body
        assert str(con.url) not in body["error"]
    assert "evals/test.tsv" in _api(con, "/api/files")[1]["files"]
    assert not [f for f in _api(con, "/api/files")[1]["files"] if "link" in f]


@pytest.mark.slow
def test_evaluate_summarizes_like_polyindex_eval(console):
    con, address, data = console
    status, s = _api(con, "/api/eval", EVAL)
    assert status == 200, s
    from polyindex.cli.evaluate import evaluate_run, parse_measures, run_queries, write_trec
    from polyindex.ingest.sources import read_qrels, read_queries
    qrels = read_qrels(data / "evals" / "test.tsv")
    qs = [q for q in read_queries(data / "evals" / "queries.jsonl") if q[0] in qrels]
    with Client(address, token=TOKEN) as client:
        coll = client.collection("cran")
        for p in ("lexical", "lexical-prf"):
            path = data.parent / f"{p}.trec"
            write_trec(path, run_queries(coll, qs, profile=p, k=100), p)
            want = evaluate_run(path, qrels, parse_measures(["nDCG@10", "R@100"]))
            for m, v in want.items():
                assert s["means"][p][m]["mean"] == pytest.approx(v)
                assert s["means"][p][m]["low"] < v < s["means"][p][m]["high"]
    w = s["wins"]["lexical-prf"]["nDCG@10"]
    assert w["wins"] + w["ties"] + w["losses"] == s["queries"] == len(qrels)
    assert w["wins"] == sum(d["delta"] > 1e-12 for d in s["deltas"]["lexical-prf"])


def test_the_load_sampler_takes_differences_of_the_counters():
    counts = {"q": 0, "lat": (0.0, 0.0)}
    s = Sampler(lambda: counts["q"], lambda: counts["lat"], interval=3600)
    s.sample()
    counts.update(q=50, lat=(50.0, 2.5))
    s.sample()
    (point,) = s.series()["points"]
    assert point["qps"] > 0 and point["latency_ms"] == pytest.approx(50.0)  # 2.5 s / 50
    counts.update(q=50)  # no queries: no latency to report
    s.sample()
    assert s.series()["points"][-1]["qps"] == 0 and s.series()["points"][-1]["latency_ms"] is None


def test_a_server_bound_to_every_address_is_dialed_over_loopback():
    assert client_address("0.0.0.0:5") == "127.0.0.1:5"
    assert client_address("[::]:5") == "127.0.0.1:5"
    assert client_address("127.0.0.1:5") == "127.0.0.1:5"


@pytest.mark.slow
def test_serve_console_port_with_a_token(tmp_path, cli):
    data = tmp_path / "data"
    _cranfield(data, 50)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    proc, _ = start_server(data, "--token-file", token, "--console-port", "0",
                           "--frontend", "python")
    try:
        line = proc.stdout.readline()
        assert line.startswith("polyindex console on http://127.0.0.1:"), line
        url = line.split()[-1]
        assert _get(url + "api/overview")[0] == 401
        status, _, body = _get(url + "api/overview", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and json.loads(body)["health"] == "SERVING"
    finally:
        code, err = stop_server(proc)
    assert code == 0, err


def test_the_console_beyond_loopback_needs_a_token(tmp_path, cli):
    res = cli("serve", "--data", tmp_path / "data", "--port", "0", "--console-port", "0",
              "--console-host", "0.0.0.0", timeout=120)
    assert res.returncode == 2
    assert "--host 0.0.0.0 is beyond loopback" in res.stderr and "--insecure" in res.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened


@pytest.mark.slow
def test_eval_plot_writes_html_and_png(tmp_path, cli):
    data = tmp_path / "data"
    _cranfield(data, 300)
    args = ["eval", "--data", data, "-c", "cran", "--queries", CRANFIELD / "queries.jsonl",
            "--qrels", CRANFIELD / "qrels" / "test.tsv", "-p", "lexical", "-p", "lexical-prf",
            "--k", "100"]
    res = cli(*args, "--plot", tmp_path / "ev.html", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "ev.html").read_text()
    assert "Chart.js v4" in page and "PICharts.evaluation" in page and "/static/" not in page
    summary = json.loads(page.split("const summary = ", 1)[1].split(";\n", 1)[0])
    results = json.loads(res.stdout)["results"]
    assert summary["means"]["lexical"]["nDCG@10"]["mean"] == pytest.approx(
        results["lexical"]["nDCG@10"])
    res = cli(*args, "--plot", tmp_path / "ev.svg")
    assert res.returncode == 2 and "give a .html or .png file" in res.stderr
    pytest.importorskip("matplotlib", reason="--plot FILE.png needs the plot extra")
    res = cli(*args, "--plot", tmp_path / "ev.png", timeout=300)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
