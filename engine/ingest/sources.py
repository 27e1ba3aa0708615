"""Streaming document readers (BEIR, JSONL, Parquet, Arrow IPC, CSV) with precise, located errors.

Vectors (see ``ingest.vectors``): JSONL records carry ``"vector"`` / ``"vectors"``; Parquet and
Arrow files carry columns ``vector`` (the unnamed field), ``vector.<field>`` or a struct
column ``vectors``, each FixedSizeList or list of numbers, read as numpy views of the Arrow
buffers (no per-value Python objects); CSV refuses vector columns.

``Source.records()`` yields ``(position, Document | InputError)``: a bad record is handed to the
caller as a value so that it can choose to fail or to skip. Problems that make the rest of a
file unreadable (corrupt gzip, wrong Parquet schema, missing CSV header) are raised instead.
Memory is bounded by one line / one CSV row / one Parquet batch, never by the file size.
"""
from __future__ import annotations

import csv
import gzip
import json
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from polyindex.errors import InputError, InvalidArgument
from polyindex.ingest.export import METADATA_COLUMN, RESERVED
from polyindex.ingest.records import document_from_record
from polyindex.ingest.records import jsonable as _jsonable
from polyindex.ingest.records import kind_of as _kind
from polyindex.ingest.tokens import token_column_rows
from polyindex.ingest.vector_columns import check_vector_schema, split_vector_columns
from polyindex.ingest.vector_files import VECTOR_FORMATS, count_rows, vector_file_records
from polyindex.types import Document

FORMATS = ("beir", "jsonl", "parquet", "arrow", "csv", "npy", "fvecs", "bvecs", "hdf5")
PARQUET_BATCH = 4096
_GZIP_MAGIC = b"\x1f\x8b"
_GZ_COUNT_LIMIT = 200 * 1024 * 1024  # counting lines of a bigger .gz means decompressing it all
_CORE = ("_id", "id", "title", "text")
_CSV_FIELD_LIMIT = 1 << 26  # the csv default (128 KiB) is too small for long documents
_READ_ERRORS = (OSError, EOFError, zlib.error)  # truncated or corrupt (gzip) data


# ---------------------------------------------------------------- opening

def _detect(path: Path) -> str:
    if path.is_dir():
        return "beir"
    name = path.name.lower()
    if path.suffix.lower() in VECTOR_FORMATS:
        return VECTOR_FORMATS[path.suffix.lower()]
    for suffixes, fmt in (((".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"), "jsonl"),
                          ((".parquet",), "parquet"), ((".arrow", ".feather", ".ipc"), "arrow"),
                          ((".csv", ".csv.gz"), "csv")):
        if name.endswith(suffixes):
            return fmt
    raise InvalidArgument(f"{path}: unknown document format (expected a BEIR folder, .jsonl, "
                          ".jsonl.gz, .ndjson, .parquet, .arrow, .csv, .csv.gz, .npy, .fvecs, "
                          ".bvecs or .hdf5; or pass fmt=)")


def _beir_corpus(folder: Path) -> Path:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    raise InvalidArgument(f"{folder}: BEIR folder has no corpus.jsonl or corpus.jsonl.gz")


def open_source(path: str | Path, fmt: str | None = None, ids: str | Path | None = None) -> "Source":
    """Open a document file or BEIR folder; ``fmt`` overrides detection by name; ``ids``: the
    id file (one per line) of a vector file (.npy, .fvecs, .bvecs, .hdf5)."""
    path = Path(path)
    if not path.exists():
        raise InvalidArgument(f"{path}: no such file or directory")
    if ids is not None and not Path(ids).is_file():
        raise InvalidArgument(f"{ids}: no such id file")
    if fmt is not None and fmt not in FORMATS:
        raise InvalidArgument(f"{path}: unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    fmt = fmt or _detect(path)
    if path.is_dir():
        if fmt != "beir":
            raise InvalidArgument(f"{path}: is a directory, but format {fmt!r} needs a file")
        return Source(path, fmt, _beir_corpus(path))
    if ids is not None and fmt not in VECTOR_FORMATS.values():
        raise InvalidArgument(f"{path}: an id file goes with a vector file (.npy, .fvecs, "
                              ".bvecs, .hdf5), not with {fmt}")
    src = Source(path, fmt, path)  # fmt="beir" on a file: a bare BEIR corpus.jsonl
    src.ids_path = None if ids is None else Path(ids)
    return src


def _is_gzip(path: Path) -> bool:
    # Sniff the magic rather than trusting the name, so fmt= overrides work on odd names.
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def _open_bytes(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")


# ---------------------------------------------------------------- JSONL

def _json_lines(path: Path, source: str, start: int = 0
                ) -> Iterator[tuple[int, int, dict[str, Any] | InputError]]:
    """Yield (position, line number, JSON object or error) for each non-blank line.

    The first ``start`` records are only counted (not decoded or parsed) and not yielded.
    Bytes are decoded per line so that invalid UTF-8 is reported at its own line.
    """
    position, lineno = 0, 0
    with _open_bytes(path) as f:
        lines = iter(f)
        while True:
            try:
                raw = next(lines, None)
            except _READ_ERRORS as e:  # the rest of the file cannot be read: raise, not yield
                raise InputError(f"unreadable data: {e}", source=source, line=lineno + 1) from e
            if raw is None:
                return
            lineno += 1
            if not raw.strip():
                continue
            position += 1
            if position <= start:
                continue
            yield position - 1, lineno, _parse_json_line(raw, source, lineno)


def _parse_json_line(raw: bytes, source: str, lineno: int) -> dict[str, Any] | InputError:
    try:
        text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        return InputError(f"invalid UTF-8: {e.reason} at byte {e.start}", source=source, line=lineno)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return InputError(f"malformed JSON: {e.msg} at column {e.colno}", source=source, line=lineno)
    except RecursionError:
        return InputError("malformed JSON: nested too deeply", source=source, line=lineno)
    if not isinstance(obj, dict):
        return InputError(f"expected a JSON object, got {_kind(obj)}", source=source, line=lineno)
    return obj


def _jsonl_records(path: Path, source: str, start: int, fields: dict[str, str],
                   vectors=None) -> Iterator[tuple[int, Document | InputError]]:
    for position, lineno, obj in _json_lines(path, source, start):
        yield position, (obj if isinstance(obj, InputError)
                         else document_from_record(obj, source, lineno, fields, vectors=vectors))


# ---------------------------------------------------------------- CSV

class _DecodedLines:
    """Feeds csv.reader one decoded physical line at a time, remembering undecodable lines."""

    def __init__(self, f: BinaryIO):
        self._f, self.lineno, self.bad = f, 0, {}

    def __iter__(self) -> "_DecodedLines":
        return self

    def __next__(self) -> str:
        raw = self._f.readline()
        if not raw:
            raise StopIteration
        self.lineno += 1
        try:
            return raw.decode("utf-8-sig" if self.lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            self.bad[self.lineno] = f"invalid UTF-8: {e.reason} at byte {e.start}"
            return raw.decode("utf-8", "replace")


def _csv_records(path: Path, source: str, start: int, fields: dict[str, str],
                 vectors=None) -> Iterator[tuple[int, Document | InputError]]:
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    with _open_bytes(path) as f:
        lines = _DecodedLines(f)
        reader = csv.reader(lines)
        header = _csv_header(reader, lines, source)
        position, prev_line = 0, reader.line_num
        while True:
            try:
                row = next(reader, None)
            except (csv.Error, *_READ_ERRORS) as e:
                # The parser cannot resynchronise after this, so the rest of the file is lost.
                raise InputError(f"unreadable CSV: {e}", source=source, line=lines.lineno) from e
            if row is None:
                return
            first, last = prev_line + 1, reader.line_num
            prev_line = last
            if not row:  # blank line
                continue
            position += 1
            if position <= start:
                continue
            yield position - 1, _csv_row(header, row, lines, first, last, source, fields, vectors)


def _csv_header(reader: Any, lines: _DecodedLines, source: str) -> list[str]:
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise InputError(f"unreadable CSV header: {e}", source=source, line=lines.lineno) from e
    if lines.bad:
        raise InputError(lines.bad[1], source=source, line=1)
    for col in ("id", "text"):
        if not header or not ({col, "_" + col} & set(header)):
            raise InputError(f"CSV header row has no {col!r} column", source=source, line=1, field=col)
    if len(set(header)) != len(header):
        raise InputError("CSV header has duplicate column names", source=source, line=1)
    for col in header:
        if col in ("vector", "vectors", "tokens") or col.startswith("vector."):
            raise InputError("CSV cannot carry vectors (a cell is text, not a list of floats); "
                             "use JSONL, Parquet or Arrow", source=source, line=1, field=col)
    return header


def _csv_row(header: list[str], row: list[str], lines: _DecodedLines, first: int, last: int,
             source: str, fields: dict[str, str], vectors=None) -> Document | InputError:
    bad = [(n, lines.bad.pop(n)) for n in range(first, last + 1) if n in lines.bad]  # pop: bounded dict
    if bad:
        return InputError(bad[0][1], source=source, line=bad[0][0])
    if len(row) != len(header):
        return InputError(f"expected {len(header)} fields, got {len(row)}", source=source, line=first)
    # Every CSV cell is text: declared fields are parsed to their type (year:int -> 1961)
    return document_from_record(dict(zip(header, row)), source, first, fields, from_text=True,
                                vectors=vectors)


# ---------------------------------------------------------------- Parquet

def _parquet_file(path: Path, source: str):
    import pyarrow.parquet as pq  # deferred: pyarrow is heavy and only Parquet needs it
    try:
        return pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for non-Parquet data
        raise InputError(f"not a readable Parquet file: {e}", source=source) from e


def _check_parquet_schema(schema: Any, source: str) -> None:
    import pyarrow.types as pt
    names = schema.names
    id_col = "_id" if "_id" in names else "id"
    has_vectors = any(n in ("vector", "vectors", "tokens") or n.startswith("vector.")
                      for n in names)
    for col in (id_col,) if has_vectors else (id_col, "text"):  # vectors may stand for the text
        if col not in names:
            raise InputError(f"Parquet file has no {col!r} column", source=source, field=col)
    is_str = lambda t: pt.is_string(t) or pt.is_large_string(t) or str(t) == "string_view"  # noqa: E731
    checks = [(id_col, lambda t: is_str(t) or pt.is_integer(t), "string or integer"),
              ("text", is_str, "string"),
              ("title", lambda t: is_str(t) or pt.is_null(t), "string or null")]
    for col, ok, wanted in checks:
        if col in names and not ok(schema.field(col).type):
            raise InputError(f"column {col!r} must be {wanted}, got {schema.field(col).type}",
                             source=source, field=col)


def _parquet_records(path: Path, source: str, start: int, fields: dict[str, str],
                     vectors=None) -> Iterator[tuple[int, Document | InputError]]:
    pf = _parquet_file(path, source)
    with pf:
        _check_parquet_schema(pf.schema_arrow, source)
        check_vector_schema(pf.schema_arrow, source)
        # Skip whole row groups without reading them; slice the first batch for the remainder.
        groups, skip, position = [], start, 0
        for i in range(pf.metadata.num_row_groups):
            rows = pf.metadata.row_group(i).num_rows
            if not groups and skip >= rows:
                skip, position = skip - rows, position + rows
            else:
                groups.append(i)
        if not groups:
            return
        batches = pf.iter_batches(batch_size=PARQUET_BATCH, row_groups=groups)
        while True:
            try:
                batch = next(batches, None)
            except Exception as e:  # noqa: BLE001 - pyarrow raises OSError / ArrowException
                raise InputError(f"unreadable Parquet data: {e}", source=source, line=position + 1) from e
            if batch is None:
                return
            if skip >= batch.num_rows:
                skip, position = skip - batch.num_rows, position + batch.num_rows
                continue
            if skip:
                batch, position, skip = batch.slice(skip), position + skip, 0
            for item in batch_records(batch, source, position, fields, vectors):
                yield position, item
                position += 1


def batch_records(batch, source: str, position: int, fields: dict[str, str] | None = None,
                  vectors=None) -> Iterator[Document | InputError]:
    """The records of one Arrow batch (rows ``position + 1`` ...): vector columns as numpy
    rows of the batch's buffers, everything else as Python values."""
    meta_json = None
    reserved = [n for n in batch.schema.names if n.startswith(RESERVED)]
    if reserved:  # an export's own columns (``ingest.export``): its metadata, not its copies
        if METADATA_COLUMN in reserved:
            meta_json = batch.column(METADATA_COLUMN).to_pylist()
        batch = batch.drop_columns(reserved)
    vecs, rest = split_vector_columns(batch)
    toks = None
    if "tokens" in rest.schema.names:  # per-row (n_tokens, d) views of the batch's values
        toks = token_column_rows(rest.column("tokens"))
        rest = rest.drop_columns(["tokens"])
    for j, rec in enumerate(rest.to_pylist()):
        rec = {k: v if k in _CORE else _jsonable(v) for k, v in rec.items()}
        if meta_json is not None and meta_json[j]:
            try:
                extra = json.loads(meta_json[j])
                if not isinstance(extra, dict):
                    raise ValueError(f"a JSON object is needed, got {_kind(extra)}")
            except ValueError as e:
                yield InputError(f"not JSON metadata: {e}"[:300], source=source,
                                 line=position + j + 1, field=METADATA_COLUMN)
                continue
            rec["metadata"] = {**extra, **(rec.get("metadata") or {})}
        if vecs:
            rec["vectors"] = {f: m[j] for f, m in vecs.items()}
        if toks is not None:
            rec["tokens"] = toks[j]
        yield document_from_record(rec, source, position + j + 1, fields, vectors=vectors)


# ---------------------------------------------------------------- Arrow IPC

def _arrow_records(path: Path, source: str, start: int, fields: dict[str, str],
                   vectors=None) -> Iterator[tuple[int, Document | InputError]]:
    import pyarrow as pa
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
    except Exception:  # noqa: BLE001 - not the file format: maybe the stream format
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid / OSError
            raise InputError(f"not a readable Arrow IPC file: {e}", source=source) from e
    _check_parquet_schema(reader.schema, source)
    check_vector_schema(reader.schema, source)
    batches = ([reader.get_batch(i) for i in range(reader.num_record_batches)]
               if hasattr(reader, "num_record_batches") else reader)
    position = 0
    for batch in batches:
        if position + batch.num_rows <= start:
            position += batch.num_rows
            continue
        if position < start:
            batch, position = batch.slice(start - position), start
        for item in batch_records(batch, source, position, fields, vectors):
            yield position, item
            position += 1


# ---------------------------------------------------------------- Source

def _count_newlines(path: Path) -> int | None:
    if _is_gzip(path) and path.stat().st_size >= _GZ_COUNT_LIMIT:
        return None
    count, last = 0, b"\n"
    try:
        with _open_bytes(path) as f:
            while chunk := f.read(1 << 20):
                count, last = count + chunk.count(b"\n"), chunk[-1:]
    except _READ_ERRORS:
        return None  # unknown; records() reports the damage with its line number
    return count + (last != b"\n")  # a last line without its newline is a record too


class Source:
    """One document file (or BEIR folder). ``path`` is as given; ``data_path`` is the file read."""

    def __init__(self, path: Path, format: str, data_path: Path):  # noqa: A002 - spec'd name
        self.path, self.format, self.data_path = path, format, data_path
        self.ids_path: Path | None = None  # the id file of a vector file

    def __repr__(self) -> str:
        return f"Source({str(self.path)!r}, format={self.format!r})"

    @property
    def name(self) -> str:
        """How errors name the file: the data file as the user spelled it."""
        return str(self.data_path)

    def fingerprint(self) -> dict:
        st = self.data_path.stat()
        return {"path": str(self.data_path.resolve()), "format": self.format,
                "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def estimate_total(self) -> int | None:
        if self.format == "parquet":
            with _parquet_file(self.data_path, self.name) as pf:
                return pf.metadata.num_rows
        if self.format == "arrow":
            return None
        if self.format in VECTOR_FORMATS.values():
            return count_rows(self.data_path, self.name)
        lines = _count_newlines(self.data_path)
        if lines is None or self.format != "csv":
            return lines
        return max(lines - 1, 0)  # the header

    def records(self, start: int = 0, fields: dict[str, str] | None = None, vectors=None
                ) -> Iterator[tuple[int, Document | InputError]]:
        """``fields``: declared metadata fields (name -> type), checked per record (CSV text
        parsed to the type), so a wrong value is reported with its file and line. ``vectors``:
        the collection's ``VectorSpec``, to check each record's vectors."""
        if start < 0:
            raise InvalidArgument(f"start must be >= 0, got {start}")
        if self.format in VECTOR_FORMATS.values():
            return vector_file_records(self.data_path, self.name, start, vectors, self.ids_path)
        reader = {"parquet": _parquet_records, "csv": _csv_records,
                  "arrow": _arrow_records}.get(self.format, _jsonl_records)
        return reader(self.data_path, self.name, start, dict(fields or {}), vectors)


# ---------------------------------------------------------------- queries and qrels

def read_queries(path: str | Path) -> list[tuple[str, str]]:
    """Read queries as [(id, text)]; raises InputError at the bad line.

    Formats, told apart by content: BEIR ``queries.jsonl`` (or a BEIR folder holding one),
    TSV ``id<TAB>text`` lines (MS MARCO style; a ``query-id``/``qid`` header is skipped), and
    TREC topics (``<top><num> Number: 51 <title> ...`` or ``<topic number="51"><query>``):
    the title (or query) is the text.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "queries.jsonl"
    if not path.is_file():
        raise InvalidArgument(f"{path}: no such queries file")
    source = str(path)
    first = next((line for _, line in _text_lines(path, source)), "")
    if first.startswith("<"):
        from polyindex.ingest.topics import read_trec_topics
        queries = read_trec_topics(path, source)
    elif first.startswith("{"):
        queries = _jsonl_queries(path, source)
    else:
        queries = _tsv_queries(path, source)
    seen: dict[str, int] = {}
    for i, (qid, _) in enumerate(queries):
        if qid in seen:
            raise InputError(f"query id {qid!r} given twice (query {seen[qid] + 1} and {i + 1})",
                             source=source, doc_id=qid)
        seen[qid] = i
    return queries


def _query(qid: Any, text: Any, source: str, lineno: int) -> tuple[str, str]:
    doc = document_from_record({"_id": qid, "text": text, "title": ""}, source, lineno)
    if isinstance(doc, InputError):
        raise InputError(doc.reason.replace("document", "query"), source=source, line=lineno,
                         field=doc.field, doc_id=doc.doc_id)
    if not doc.text.strip():
        raise InputError("empty query text", source=source, line=lineno, field="text",
                         doc_id=doc.id)
    return doc.id, doc.text


def _jsonl_queries(path: Path, source: str) -> list[tuple[str, str]]:
    queries = []
    for _, lineno, obj in _json_lines(path, source):
        if isinstance(obj, InputError):
            raise obj
        queries.append(_query(obj.get("_id", obj.get("id")), obj.get("text"), source, lineno))
    return queries


def _tsv_queries(path: Path, source: str) -> list[tuple[str, str]]:
    queries = []
    for lineno, line in _text_lines(path, source):
        qid, tab, text = line.partition("\t")
        if not tab:
            raise InputError("expected 'id<TAB>text' (TSV), a JSON object (JSONL) or TREC "
                             "topics (<top>)", source=source, line=lineno)
        if not queries and qid.strip().lower() in ("query-id", "qid", "query_id", "id", "_id"):
            continue  # a header row
        queries.append(_query(qid.strip(), text.strip(), source, lineno))
    return queries


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read BEIR qrels TSV ("query-id corpus-id score" header) or TREC qrels ("qid 0 docid rel").

    A BEIR folder reads qrels/test.tsv. Later duplicates of a (query, doc) pair win.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "qrels" / "test.tsv"
    if not path.is_file():
        raise InvalidArgument(f"{path}: no such qrels file")
    source, qrels, width = str(path), {}, None
    for lineno, line in _text_lines(path, source):
        fields = [x.strip() for x in (line.split("\t") if "\t" in line else line.split())]
        if width is None and len(fields) == 3 and fields[2].lower() in ("score", "relevance", "rel"):
            width = 3
            continue  # the BEIR header
        if len(fields) != (width or len(fields)) or len(fields) not in (3, 4):
            want = width or "3 (BEIR) or 4 (TREC)"
            raise InputError(f"expected {want} columns, got {len(fields)}", source=source, line=lineno)
        width = len(fields)
        qid, did, score = fields[0], fields[-2], fields[-1]
        if not qid or not did:
            raise InputError("empty query or document id", source=source, line=lineno)
        try:
            qrels.setdefault(qid, {})[did] = int(score)
        except ValueError:
            raise InputError(f"relevance must be an integer, got {score!r}", source=source,
                             line=lineno, field="score", doc_id=did) from None
    return qrels


def _text_lines(path: Path, source: str) -> Iterator[tuple[int, str]]:
    """(line number, stripped text) of each non-blank line; raises on invalid UTF-8."""
    with _open_bytes(path) as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
            except UnicodeDecodeError as e:
                raise InputError(f"invalid UTF-8: {e.reason} at byte {e.start}", source=source, line=lineno) from None
            if line:
                yield lineno, line
