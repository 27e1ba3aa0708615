"""Bulk ingestion: stream a source, cut it into segments, encode, build, commit per segment.

Memory is bounded by one segment (two when encoding overlaps building: on a cuda placement,
or with ``POLYINDEX_OVERLAP_ENCODE=1``, the next segment is encoded on the GPU by a thread
while this one's indexes are built and committed, ``_Overlap``). Each commit records the source's fingerprint and the
position after the segment's last record, so an interrupted run resumes from the last
committed segment; duplicate ids are upserts (last write wins, also within a segment).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from polyindex.config import settings
from polyindex.types import document_text

from polyindex.errors import InputError
from polyindex.ingest.progress import ObservedKind, Phases
from polyindex.ingest.sources import Source


@dataclass
class IngestReport:
    indexed: int = 0          # documents written by this run
    skipped_invalid: int = 0  # bad records skipped (--skip-invalid)
    segments: int = 0
    resumed_from: int = 0     # source position this run started at
    already_indexed: bool = False

    def to_json(self) -> dict:
        return asdict(self)


def resume_point(manifest, fingerprint: str, force: bool, report) -> int | None:
    """Where an ingest of ``fingerprint``'s source starts: after what the manifest says an
    earlier run of the same source committed (0 for a new source or ``force``); None when
    that run finished (``report.already_indexed``)."""
    job = manifest.ingest
    start = 0
    if job and job.get("source") == fingerprint and not force:
        if job.get("done"):
            report.already_indexed = True
            return None
        start = int(job["position"])
        report.skipped_invalid = int(job.get("skipped_invalid", 0))
    report.resumed_from = start
    return start


def bulk_index(table, source: Source, *, skip_invalid: bool = False, progress: bool = True,
               force: bool = False, plan=None) -> IngestReport:
    """``plan(writer, source, fields, vector_spec)``: run once before the first record (the
    collection's document-quality pass over the whole input, ``ingest.quality.plan``)."""
    report = IngestReport()
    fingerprint = source.fingerprint()
    with table.writer() as w, Phases(enabled=progress) as phases:
        if progress:  # each kind's training and build show as phases of the run
            w.kinds = {name: ObservedKind(kind, phases) for name, kind in w.kinds.items()}
        start = resume_point(w.manifest, fingerprint, force, report)
        if start is None:
            return report
        total = source.estimate_total()
        size = table.config.segment_size
        fields = table.config.fields
        spec = table.encoding.vector_spec()
        buffer: dict = {}
        position = start
        if plan is not None:
            plan(w, source, fields, spec)

        def state(done: bool) -> dict:
            return {"source": fingerprint, "position": position, "done": done,
                    "skipped_invalid": report.skipped_invalid}

        advance = phases.records(f"indexing {source.path.name}",
                                 None if total is None else total - start)
        encode_progress = advance if w.encode is not None else None
        # pruning decides what is encoded: the writer encodes (no overlap) when it prunes
        overlap = _Overlap(w) if w.encode is not None and _overlaps(table) \
            and w.manifest.config.prune_threshold is None else None
        seal = overlap.seal if overlap is not None else _seal
        try:
            for pos, item in source.records(start, fields, vectors=spec):
                position = pos + 1
                if isinstance(item, InputError):
                    if not skip_invalid:
                        raise item  # the open segment is dropped: nothing of it is committed
                    report.skipped_invalid += 1
                    advance(1)  # the bar counts records consumed
                    continue
                if buffer.pop(item.id, None) is not None:  # last write wins, also in a segment
                    advance(1)  # the replaced record will never be encoded
                buffer[item.id] = item
                if len(buffer) >= size:
                    seal(w, buffer, fields, state(False), encode_progress, advance, report, spec)
            seal(w, buffer, fields, state(True), encode_progress, advance, report, spec)
            if overlap is not None:
                overlap.finish()
        finally:  # an error drops the uncommitted segments (a rerun resumes before them)
            if overlap is not None:
                overlap.pool.shutdown(wait=True, cancel_futures=True)
    table.refresh()
    return report


def _overlaps(table) -> bool:
    return getattr(table, "device", "cpu") == "cuda" \
        or settings().overlap_encode


class _Overlap:
    """Encoding of segment i+1 (a worker thread: the GPU forward passes release the GIL)
    overlapping the build and commit of segment i (this thread). Segments are committed in
    order, each with the ingest position of its last record, so resuming is unchanged."""

    def __init__(self, w):
        self.w = w
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="polyindex-encode")
        self.pending = None  # (arguments of the previous segment's commit, encode future)

    def seal(self, w, buffer, fields, ingest, encode_progress, advance, report, spec) -> None:
        docs = list(buffer.values())
        buffer.clear()
        fut = self.pool.submit(self.w.encode, [document_text(d.title, d.text) for d in docs],
                               encode_progress) if docs else None
        self._commit_pending()
        self.pending = ((docs, fields, ingest, report, spec), fut)

    def _commit_pending(self) -> None:
        if self.pending is None:
            return
        (docs, fields, ingest, report, spec), fut = self.pending
        self.pending = None
        out = fut.result() if fut is not None else None
        emb, tokens = out if isinstance(out, tuple) else (out, None)
        _commit(self.w, docs, fields, ingest, report, spec, emb, tokens)

    def finish(self) -> None:
        try:
            self._commit_pending()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _commit(w, docs, fields, ingest, report, spec, emb, tokens) -> None:
    vectors = spec.stack(docs) if spec and docs else None
    if docs and emb is None and tokens is None:
        emb = w.encode([document_text(d.title, d.text) for d in docs], None)
        emb, tokens = emb if isinstance(emb, tuple) else (emb, None)
    w.commit_segment(docs, fields, ingest=ingest, embeddings=emb, tokens=tokens,
                     vectors=vectors)
    report.indexed += len(docs)
    report.segments += bool(docs)


def _seal(w, buffer, fields, ingest, encode_progress, advance, report, spec) -> None:
    docs = list(buffer.values())
    vectors = spec.stack(docs) if spec and docs else None
    w.commit_segment(docs, fields, ingest=ingest, on_encoded=encode_progress, vectors=vectors)
    if encode_progress is None:
        advance(len(docs))
    report.indexed += len(docs)
    report.segments += bool(docs)
    buffer.clear()
