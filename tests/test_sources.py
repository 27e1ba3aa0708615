"""Tests for polyindex.ingest.sources: streaming readers and their located errors."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from polyindex.errors import InputError, InvalidArgument
from polyindex.ingest.records import document_from_record
from polyindex.ingest.sources import open_source, read_qrels, read_queries
from polyindex.types import Document

CRANFIELD = Path(__file__).resolve().parents[2] / "shared" / "data" / "cranfield"

DOCS = [
    {"_id": "d1", "title": "Alpha", "text": "first doc", "lang": "en"},
    {"_id": 2, "text": "second doc", "metadata": {"year": 1999, "tags": ["x"]}},
    {"_id": "d3", "title": None, "text": "third doc"},
    {"_id": "d4", "title": "Delta", "text": "fourth doc", "score": 1.5},
    {"_id": "d5", "title": "Echo", "text": "fifth doc"},
]


def write_jsonl(path: Path, lines: list, gz: bool = False) -> Path:
    data = b"".join((ln if isinstance(ln, bytes) else json.dumps(ln).encode()) + b"\n" for ln in lines)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def read_all(src, start=0):
    return list(src.records(start))


def comparable(items):
    """InputError instances do not compare equal; compare their messages instead."""
    return [(pos, str(it) if isinstance(it, InputError) else it) for pos, it in items]


def only_error(path: Path, lines: list) -> InputError:
    items = [it for _, it in read_all(open_source(write_jsonl(path, lines)))]
    errors = [it for it in items if isinstance(it, InputError)]
    assert len(errors) == 1, items
    return errors[0]


def check_good_docs(items):
    assert [pos for pos, _ in items] == list(range(5))
    docs = [d for _, d in items]
    assert all(isinstance(d, Document) for d in docs), docs
    assert [d.id for d in docs] == ["d1", "2", "d3", "d4", "d5"]
    assert docs[0].title == "Alpha" and docs[0].text == "first doc"
    assert docs[0].metadata == {"lang": "en"}
    assert docs[1].title == "" and docs[1].metadata == {"year": 1999, "tags": ["x"]}
    assert docs[2].title == ""
    assert docs[3].metadata == {"score": 1.5}


# ---------------------------------------------------------------- good inputs

def test_jsonl_good(tmp_path):
    src = open_source(write_jsonl(tmp_path / "docs.jsonl", DOCS))
    assert src.format == "jsonl"
    check_good_docs(read_all(src))
    assert src.estimate_total() == 5


def test_jsonl_gz_and_ndjson(tmp_path):
    src = open_source(write_jsonl(tmp_path / "docs.jsonl.gz", DOCS, gz=True))
    assert src.format == "jsonl"
    check_good_docs(read_all(src))
    assert src.estimate_total() == 5
    nd = open_source(write_jsonl(tmp_path / "docs.ndjson", DOCS))
    assert nd.format == "jsonl"
    check_good_docs(read_all(nd))


def test_blank_lines_count_for_lines_not_positions(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [DOCS[0], b"", b"   ", {"_id": "x", "text": 5}])
    items = read_all(open_source(path))
    assert [pos for pos, _ in items] == [0, 1]
    err = items[1][1]
    assert isinstance(err, InputError) and err.line == 4 and "docs.jsonl:4" in str(err)


def test_beir_folder(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl", DOCS)
    src = open_source(tmp_path)
    assert src.format == "beir"
    check_good_docs(read_all(src))
    assert src.fingerprint()["path"] == str((tmp_path / "corpus.jsonl").resolve())
    assert src.estimate_total() == 5


def test_beir_folder_gz(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl.gz", DOCS, gz=True)
    check_good_docs(read_all(open_source(tmp_path)))


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 10_000
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "title": pa.array([None if i % 2 else f"t{i}" for i in range(n)], pa.string()),
        "text": pa.array([f"text {i}" for i in range(n)], pa.string()),
        "year": pa.array([2000 + i % 20 for i in range(n)], pa.int32()),
    })
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path, row_group_size=3000)
    src = open_source(path)
    assert src.format == "parquet"
    assert src.estimate_total() == n
    items = read_all(src)
    assert [pos for pos, _ in items] == list(range(n))
    d = items[4321][1]
    assert d == Document("4321", "", "text 4321", {"year": 2000 + 4321 % 20})
    assert items[4322][1].title == "t4322"
    # start inside the second row group and inside a batch: same documents as the full read
    for start in (0, 2, 3000, 7777, n - 1, n, n + 5):
        assert read_all(src, start) == items[start:]


def test_parquet_start_skips_row_groups(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(10)], "text": ["t"] * 10}), path, row_group_size=3)
    seen = []
    real = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *a, **kw: seen.append(kw.get("row_groups")) or real(self, *a, **kw))
    assert [(p, d.id) for p, d in read_all(open_source(path), 6)] == [(i, str(i)) for i in range(6, 10)]
    assert seen == [[2, 3]]


def test_parquet_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x", None, "z"], "title": [None, "", None]}), path)
    items = read_all(open_source(path))
    assert isinstance(items[0][1], Document) and isinstance(items[2][1], Document)
    err = items[1][1]
    assert isinstance(err, InputError)
    assert "bad.parquet:2" in str(err) and "'b'" in str(err) and "missing text" in str(err)

    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": [1.5]}), wrong)
    with pytest.raises(InputError, match=r"wrong\.parquet.*'text'.*must be string"):
        read_all(open_source(wrong))
    noid = tmp_path / "noid.parquet"
    pq.write_table(pa.table({"key": ["a"], "text": ["x"]}), noid)
    with pytest.raises(InputError, match=r"noid\.parquet.*no 'id' column"):
        read_all(open_source(noid))


def test_csv(tmp_path):
    path = tmp_path / "docs.csv"
    path.write_text('id,title,text,lang\n'
                    'a,Alpha,"first, with comma",en\n'
                    '\n'
                    'b,,"multi\nline text",fr\n'
                    'c,Gamma,third,de\n', encoding="utf-8")
    src = open_source(path)
    assert src.format == "csv"
    items = read_all(src)
    assert [pos for pos, _ in items] == [0, 1, 2]
    assert items[0][1] == Document("a", "Alpha", "first, with comma", {"lang": "en"})
    assert items[1][1] == Document("b", "", "multi\nline text", {"lang": "fr"})
    assert read_all(src, 1) == items[1:]
    assert read_all(src, 2) == items[2:]
    gz = tmp_path / "docs.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [d for _, d in read_all(open_source(gz))] == [d for _, d in items]


def test_csv_errors(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b"_id,text\n"
                     b"a,fine\n"
                     b"b,bad \xff byte\n"
                     b"c,x,extra\n"
                     b"d,\n"
                     b"e,ok\n")
    items = read_all(open_source(path))
    assert [pos for pos, _ in items] == [0, 1, 2, 3, 4]
    utf, extra, empty = items[1][1], items[2][1], items[3][1]
    assert isinstance(utf, InputError) and "bad.csv:3" in str(utf) and "invalid UTF-8" in str(utf)
    assert isinstance(extra, InputError) and "bad.csv:4" in str(extra) and "expected 2 fields, got 3" in str(extra)
    assert empty == Document("d", "", "", {})  # an empty text is a (searchable-by-id) document
    assert items[4][1] == Document("e", "", "ok", {})

    nohead = tmp_path / "nohead.csv"
    nohead.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match=r"nohead\.csv:1.*'id'"):
        read_all(open_source(nohead))


# ---------------------------------------------------------------- JSONL errors

@pytest.mark.parametrize("line, reason, field", [
    (b'{"_id": "a", "text": ', "malformed JSON", None),
    (b'["a", "b"]', "expected a JSON object, got list", None),
    (b'{"title": "t", "text": "x"}', "missing id", "id"),
    (b'{"_id": "", "text": "x"}', "empty id", "_id"),
    (b'{"_id": null, "text": "x"}', "missing id", "_id"),
    (b'{"_id": true, "text": "x"}', "got bool", "_id"),
    (b'{"id": 1.5, "text": "x"}', "got float", "id"),
    (b'{"_id": ["a"], "text": "x"}', "got list", "_id"),
    (b'{"_id": {"a": 1}, "text": "x"}', "got dict", "_id"),
    (b'{"_id": "a\\tb", "text": "x"}', "control characters", "_id"),
    (b'{"_id": "' + b"x" * 1025 + b'", "text": "x"}', "max 1024", "_id"),
])
def test_jsonl_record_errors(tmp_path, line, reason, field):
    err = only_error(tmp_path / "docs.jsonl", [DOCS[0], DOCS[1], line, DOCS[3]])
    assert err.line == 3 and err.doc_id is None
    assert "docs.jsonl:3" in str(err) and reason in str(err)
    if field:
        assert err.field == field and f"field {field!r}" in str(err)


@pytest.mark.parametrize("rec, reason, field", [
    ({"_id": "q", "title": "t"}, "missing text", "text"),
    ({"_id": "q", "text": None}, "missing text", "text"),
    ({"_id": "q", "text": 7}, "field 'text' must be a string, got int", "text"),
    ({"_id": "q", "text": "x", "title": 3}, "field 'title' must be a string, got int", "title"),
    ({"_id": "q", "text": "x", "title": 0}, "field 'title' must be a string, got int", "title"),
    ({"_id": "q", "text": "x", "title": False}, "field 'title' must be a string, got bool", "title"),
])
def test_jsonl_field_errors_name_the_id(tmp_path, rec, reason, field):
    err = only_error(tmp_path / "docs.jsonl", [DOCS[0], DOCS[1], rec])
    assert err.line == 3 and err.doc_id == "q" and err.field == field
    assert "docs.jsonl:3" in str(err) and "id='q'" in str(err) and reason in str(err)


def test_int_id_is_valid_and_long_id_limit(tmp_path):
    items = read_all(open_source(write_jsonl(tmp_path / "d.jsonl", [
        {"id": 0, "text": "zero"}, {"id": "y" * 1024, "text": "ok"}])))
    assert [d.id for _, d in items] == ["0", "y" * 1024]


def test_invalid_utf8_on_line_3(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [DOCS[0], DOCS[1], b'{"_id": "x", "text": "caf\xe9"}', DOCS[3]])
    for src in (open_source(path), open_source(write_jsonl(tmp_path / "docs.jsonl.gz", [
            DOCS[0], DOCS[1], b'{"_id": "x", "text": "caf\xe9"}', DOCS[3]], gz=True))):
        items = read_all(src)
        assert [pos for pos, _ in items] == [0, 1, 2, 3]
        err = items[2][1]
        assert isinstance(err, InputError) and err.line == 3
        assert f"{src.path.name}:3" in str(err) and "invalid UTF-8" in str(err)
        assert isinstance(items[3][1], Document)


def test_start_skips_records(tmp_path):
    src = open_source(write_jsonl(tmp_path / "docs.jsonl", [DOCS[0], b"", DOCS[1], b"[1]", DOCS[3], DOCS[4]]))
    full = read_all(src)
    assert len(full) == 5
    assert isinstance(full[2][1], InputError)
    for start in range(7):
        assert comparable(read_all(src, start)) == comparable(full[start:])


def test_start_does_not_parse_skipped_lines(tmp_path, monkeypatch):
    import polyindex.ingest.sources as sources
    src = open_source(write_jsonl(tmp_path / "docs.jsonl", DOCS))
    parsed = []
    real = sources._parse_json_line
    monkeypatch.setattr(sources, "_parse_json_line", lambda raw, *a: parsed.append(raw) or real(raw, *a))
    assert [pos for pos, _ in read_all(src, 3)] == [3, 4]
    assert len(parsed) == 2
    with pytest.raises(InvalidArgument):
        src.records(-1)


def test_estimate_total_and_no_trailing_newline(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}')
    src = open_source(path)
    assert src.estimate_total() == 2 == len(read_all(src))
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    assert open_source(empty).estimate_total() == 0 and read_all(open_source(empty)) == []


def test_fingerprint_changes_with_file(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    src = open_source(path)
    fp1 = src.fingerprint()
    assert fp1 == {"path": str(path.resolve()), "format": "jsonl", "size": path.stat().st_size,
                   "mtime_ns": path.stat().st_mtime_ns}
    write_jsonl(path, DOCS + DOCS[:1])
    os.utime(path, ns=(fp1["mtime_ns"] + 10**9, fp1["mtime_ns"] + 10**9))
    fp2 = src.fingerprint()
    assert fp2 != fp1 and fp2["size"] > fp1["size"]


def test_document_from_record():
    assert document_from_record({"id": 7, "text": "x", "k": [1]}) == Document("7", "", "x", {"k": [1]})
    # Real collections hold empty documents (Cranfield 471, 995): kept, not errors.
    assert document_from_record({"id": "a", "text": ""}) == Document("a", "", "", {})
    err = document_from_record({"id": "a"}, source="add()", line=2)
    assert isinstance(err, InputError) and str(err) == "add():2, id='a', field 'text': missing text"


def test_metadata_merge(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"_id": "a", "text": "x", "lang": "en", "metadata": {"lang": "fr", "url": "u"}},
        {"_id": "b", "text": "x", "metadata": "not a dict"}])
    a, b = [d for _, d in read_all(open_source(path))]
    assert a.metadata == {"lang": "en", "url": "u"}
    assert b.metadata == {"metadata": "not a dict"}


def test_corrupt_gzip_raises_with_file_name(tmp_path):
    data = gzip.compress(b"".join(json.dumps(d).encode() + b"\n" for d in DOCS * 200))
    path = tmp_path / "docs.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"docs\.jsonl\.gz:\d+: unreadable data"):
        read_all(open_source(path))


def test_csv_invalid_utf8_inside_multiline_row(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b'id,text\na,"one\ntwo \xc3 bad\nthree"\nb,fine\n')
    items = read_all(open_source(path))
    assert isinstance(items[0][1], InputError) and items[0][1].line == 3 and "m.csv:3" in str(items[0][1])
    assert items[1] == (1, Document("b", "", "fine", {}))


def test_parquet_metadata_is_json_compatible(tmp_path):
    import datetime
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "m.parquet"
    pq.write_table(pa.table({
        "_id": ["a"], "text": ["x"], "when": [datetime.date(2020, 1, 2)], "blob": [b"hi"],
        "metadata": [{"k": 1}]}), path)
    (_, doc), = read_all(open_source(path))
    assert doc.metadata == {"when": "2020-01-02", "blob": "hi", "k": 1}
    json.dumps(doc.metadata)


# ---------------------------------------------------------------- open_source

def test_open_source_errors(tmp_path):
    with pytest.raises(InvalidArgument, match="nothere.jsonl"):
        open_source(tmp_path / "nothere.jsonl")
    (tmp_path / "docs.txt").write_text("x")
    with pytest.raises(InvalidArgument, match="docs.txt"):
        open_source(tmp_path / "docs.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="empty.*corpus"):
        open_source(tmp_path / "empty")
    with pytest.raises(InvalidArgument, match="format"):
        open_source(tmp_path / "docs.txt", fmt="xml")


def test_fmt_overrides_detection(tmp_path):
    path = write_jsonl(tmp_path / "docs.txt", DOCS, gz=True)
    src = open_source(path, fmt="jsonl")
    assert src.format == "jsonl"
    check_good_docs(read_all(src))


# ---------------------------------------------------------------- queries and qrels

def test_read_queries(tmp_path):
    path = write_jsonl(tmp_path / "queries.jsonl", [{"_id": "q1", "text": "what"}, {"_id": 2, "text": "why"}])
    assert read_queries(path) == [("q1", "what"), ("2", "why")]
    assert read_queries(tmp_path) == [("q1", "what"), ("2", "why")]
    write_jsonl(path, [{"_id": "q1", "text": "what"}, b"", {"_id": "q3"}])
    with pytest.raises(InputError, match=r"queries\.jsonl:3.*id='q3'.*missing text"):
        read_queries(path)
    write_jsonl(path, [{"_id": "q1", "text": "what"}, b"{oops"])
    with pytest.raises(InputError, match=r"queries\.jsonl:2.*malformed JSON"):
        read_queries(path)


def test_read_qrels(tmp_path):
    beir = tmp_path / "test.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq2\td1\t2\n")
    assert read_qrels(beir) == {"q1": {"d1": 1, "d2": 0}, "q2": {"d1": 2}}
    trec = tmp_path / "qrels.txt"
    trec.write_text("q1 0 d1 1\nq1 0 d2 0\n\nq2 0 d1 -1\n")
    assert read_qrels(trec) == {"q1": {"d1": 1, "d2": 0}, "q2": {"d1": -1}}
    bad = tmp_path / "bad.tsv"
    bad.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\thigh\n")
    with pytest.raises(InputError, match=r"bad\.tsv:3.*integer"):
        read_qrels(bad)
    bad.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n")
    with pytest.raises(InputError, match=r"bad\.tsv:3.*columns"):
        read_qrels(bad)
    bad.write_text("q1 0 d1 1\nq1 d2 1\n")
    with pytest.raises(InputError, match=r"bad\.tsv:2: expected 4 columns, got 3"):
        read_qrels(bad)
    bad.write_bytes(b"q1 0 d1 1\nq1 0 d\xff 1\n")
    with pytest.raises(InputError, match=r"bad\.tsv:2: invalid UTF-8"):
        read_qrels(bad)


# ---------------------------------------------------------------- cranfield

@pytest.fixture
def cranfield():
    if not CRANFIELD.is_dir():
        pytest.skip("../shared/data/cranfield not present")
    return CRANFIELD


def test_cranfield(cranfield):
    src = open_source(cranfield)
    assert src.format == "beir" and src.estimate_total() == 1400
    items = read_all(src)
    assert len(items) == 1400 and [p for p, _ in items] == list(range(1400))
    # documents 471 and 995 are empty in the original collection: kept as documents
    assert not [it for _, it in items if isinstance(it, InputError)]
    empty = {it.id for _, it in items if not it.title and not it.text}
    assert empty == {"471", "995"}
    assert items[0][1].id == "1" and items[0][1].title.startswith("experimental investigation")
    assert comparable(read_all(src, 1390)) == comparable(items[1390:])
    queries = read_queries(cranfield / "queries.jsonl")
    assert len(queries) == 225 and queries[0][0] == "1"
    qrels = read_qrels(cranfield / "qrels" / "test.tsv")
    assert len(qrels) == 225 and sum(map(len, qrels.values())) == 1612
    assert {s for q in qrels.values() for s in q.values()} == {1, 2, 3, 4}
