"""``polyindex index SRC --server HOST:PORT``: bulk-index through a running server.

A data directory has one writer; while a server holds it, documents go through the server's
Upsert stream (WAL-acknowledged, batch by batch) instead of into the directory. Records are
validated exactly as the local bulk path does (same source readers, same located errors).
"""
from __future__ import annotations

from dataclasses import dataclass

from polyindex.errors import InputError

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
                     skip_invalid: bool = False, progress: bool = True) -> tuple[RemoteReport, int]:
    """Stream ``source`` into collection ``name`` of the server at ``address`` (created with
    ``indexes``/``fields`` when missing); returns the report and the collection's count."""
    from polyindex.client.remote import Client
    from polyindex.ingest.progress import progress_bar
    report = RemoteReport()
    with Client(address, token=token) as client:
        if name not in client.list_collections():
            client.create_collection(name, indexes or ["lexical", "dense"], fields=fields,
                                     exist_ok=True)
        coll = client.collection(name)
        batch = []
        with progress_bar(f"sending {source.path.name} to {address}", source.estimate_total(),
                          enabled=progress) as advance:
            for _pos, item in source.records(0):
                if isinstance(item, InputError):
                    if not skip_invalid:
                        raise item  # earlier batches are acknowledged; this one is not sent
                    report.skipped_invalid += 1
                    advance(1)
                    continue
                batch.append({"id": item.id, "title": item.title, "text": item.text,
                              **item.metadata})
                if len(batch) >= BATCH:
                    report.indexed += coll.add(batch)
                    report.batches += 1
                    advance(len(batch))
                    batch = []
            if batch:
                report.indexed += coll.add(batch)
                report.batches += 1
                advance(len(batch))
        return report, coll.count()
