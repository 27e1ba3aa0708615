"""``polyindex index SRC --server HOST:PORT``: bulk-index through a running server.

A data directory has one writer; while a server holds it, documents go through the server's
Upsert stream (WAL-acknowledged, batch by batch) instead of into the directory. Records are
validated exactly as the local bulk path does (same source readers, same located errors).
"""
from __future__ import annotations

from dataclasses import dataclass

from polyindex.config import DEFAULT_INDEXES, check_declared
from polyindex.errors import AlreadyExists, InputError, PolyindexError

BATCH = 1000  # documents per Upsert call: each call is all or nothing, and acknowledged


@dataclass
class RemoteReport:
    indexed: int = 0
    skipped_invalid: int = 0
    batches: int = 0

    def to_json(self) -> dict:
        return {"indexed": self.indexed, "skipped_invalid": self.skipped_invalid,
                "batches": self.batches, "via": "server"}


def index_via_server(address: str, name: str, source, *, indexes, fields, token=None,
                     skip_invalid: bool = False, progress: bool = True,
                     create: dict | None = None) -> tuple[RemoteReport, int]:
    """Stream ``source`` into collection ``name`` of the server at ``address`` (created with
    ``indexes``/``fields`` and ``create``'s model, dtype, segment_size when missing); returns
    the report and the collection's count.

    Records are read with the collection's declared fields, as the local path reads them (a
    CSV cell ``2022`` of ``year:int`` is sent as 2022; a bad one is named by file:line). A
    first run that has nothing acknowledged drops the collection it created, as local
    ``index`` does."""
    from polyindex.client.remote import Client
    report = RemoteReport()
    with Client(address, token=token) as client:
        created = False
        if name not in client.list_collections():
            try:
                client.create_collection(name, indexes or list(DEFAULT_INDEXES), fields=fields,
                                         **(create or {}))
                created = True
            except AlreadyExists:
                pass  # created meanwhile by another client: not ours to drop
        coll = client.collection(name)
        if not created:  # checked before anything is sent
            check_declared(name, coll.fields, fields, "--field")
        try:
            _send(coll, address, source, skip_invalid, progress, report)
        except BaseException:
            if created and report.batches == 0 and _is_empty(coll):
                client.drop_collection(name)
            raise
        return report, coll.count()


def _send(coll, address: str, source, skip_invalid: bool, progress: bool,
          report: RemoteReport) -> None:
    from polyindex.ingest.progress import progress_bar
    batch: list = []
    with progress_bar(f"sending {source.path.name} to {address}", source.estimate_total(),
                      enabled=progress) as advance:
        def flush():
            report.indexed += _add(coll, batch, source.name)
            report.batches += 1
            advance(len(batch))
            batch.clear()

        for _pos, item in source.records(0, coll.fields):
            if isinstance(item, InputError):
                if not skip_invalid:
                    raise item  # earlier batches are acknowledged; this one is not sent
                report.skipped_invalid += 1
                advance(1)
                continue
            batch.append(item)  # the Document as read: typed metadata, vectors, tokens
            if len(batch) >= BATCH:
                flush()
        if batch:
            flush()


def _add(coll, batch: list, source: str) -> int:
    """One acknowledged batch; a record the server refuses is named by the source file and
    its id (the server numbers records in the call, not in the file)."""
    try:
        return coll.add(batch)
    except InputError as e:
        if e.source != "add()":
            raise
        doc_id = e.doc_id if e.doc_id is not None or not e.line else batch[e.line - 1].id
        raise InputError(e.reason, source=source, field=e.field, doc_id=doc_id) from None


def _is_empty(coll) -> bool:
    try:
        return coll.count() == 0
    except PolyindexError:
        return False  # cannot tell: keep it
