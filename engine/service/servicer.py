"""The ``polyindex.v1.Polyindex`` servicer: request validation at the edge, then the engine.

Every RPC goes through ``_rpc``: deadline check, errors mapped in one place
(``polyindex.wire.grpc_errors``), metrics recorded. Queries run concurrently on the server's thread
pool; the engine's own per-collection locks guard writes, nothing here serializes reads.
"""
from __future__ import annotations

import collections
import json
import functools
import os
import threading
import time
from dataclasses import dataclass

import grpc
import numpy as np

from polyindex.config import DEFAULT_INDEXES
from polyindex.errors import (FailedPrecondition, InputError, InvalidArgument, PolyindexError,
                              ResourceExhausted, cancelled)
from polyindex.ingest.records import document_from_record
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.service.group import is_internal, process_stats
from polyindex.service.redact import Redactor
from polyindex import types as limits
from polyindex.wire import grpc_errors
from polyindex.wire.convert import (
    add_hits,
    doc_to_proto,
    from_struct,
    to_struct,
    tokens_from_proto,
    vectors_from_proto,
)
from polyindex.wire.grpc_errors import Cancelled, DeadlineExceeded


@dataclass(frozen=True)
class Limits:
    """The caps this server enforces before any work starts (defaults: ``polyindex.types``,
    README's "Limits" table)."""
    max_k: int = limits.MAX_K
    max_text_chars: int = limits.MAX_TEXT_CHARS
    max_vector_dims: int = limits.MAX_VECTOR_DIMS
    max_batch: int = limits.MAX_BATCH  # queries per Query call
    max_filter_nodes: int = limits.MAX_FILTER_NODES
    max_filter_depth: int = limits.MAX_FILTER_DEPTH
    max_ids: int = limits.MAX_IDS  # per Get or Delete
    max_scroll: int = limits.MAX_SCROLL  # documents per Scroll page
    max_upsert_records: int = limits.MAX_UPSERT_RECORDS
    max_upsert_bytes: int = limits.MAX_UPSERT_BYTES  # one stream is held whole (all or nothing)
    max_row_errors: int = 1000  # reported per Upsert; `failed` counts them all


def json_shape(value) -> tuple[int, int]:
    """(nodes, depth) of a JSON-like value (a filter, an inline profile), walked without
    recursion: every dict entry, list item and scalar is a node."""
    nodes, depth, stack = 0, 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        nodes, depth = nodes + 1, max(depth, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, d + 1) for x in v)
    return nodes, depth


def check_shape(what: str, value, max_nodes: int, max_depth: int):
    nodes, depth = json_shape(value)
    if nodes > max_nodes:
        raise InvalidArgument(f"{what} has {nodes} nodes (max {max_nodes})")
    if depth > max_depth:
        raise InvalidArgument(f"{what} is nested {depth} levels deep (max {max_depth})")
    return value


def check_count(what: str, n: int, cap: int) -> None:
    if n > cap:
        raise ResourceExhausted(f"{what}: {n} given (max {cap} per call)")


# The calls a group's processes make to each other (queries never are: no metadata scan)
_MAY_BE_INTERNAL = frozenset({"Upsert", "Delete", "DeleteWhere", "CreateCollection",
                              "DropCollection", "Stats", "CreateSnapshot", "DeleteSnapshot",
                              "AdaptCollection"})


def _rpc(method):
    """Wrap a servicer method: deadline, error mapping, metrics. ``tags`` carries labels."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, request, context):
        start, tags, err = time.perf_counter(), {"profile": ""}, None
        with self._flight_lock:
            self.flight[name] += 1
        # long work the call starts stops when the call is over (``errors.check_cancelled``)
        token = cancelled.set(lambda: not context.is_active())
        try:
            check_deadline(context, name)
            response = method(self, request, context, tags)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status, never a crash
            err = self.redact.error(grpc_errors.as_polyindex_error(e, name))
        finally:
            cancelled.reset(token)
            with self._flight_lock:
                self.flight[name] -= 1
        code = "OK" if err is None else grpc_errors.status_code(err).name
        # A call one process of a group makes to another (a forwarded write, a sibling's
        # Stats) is counted where the client's call arrived, not twice in the group's sums
        internal = self.member is not None and name in _MAY_BE_INTERNAL and is_internal(context)
        self.metrics.observe(name, code, time.perf_counter() - start,
                             tags["profile"] if err is None else "", tally=not internal)
        if err is not None:
            grpc_errors.abort(context, err)
        return response
    return wrapper


def check_deadline(context: grpc.ServicerContext, what: str) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded(f"deadline exceeded before {what}")


def _fields(req) -> list[str] | None:
    """A request's field selection: None (unset: every field) or the names."""
    return list(req.fields.names) if req.HasField("fields") else None


class PolyindexService(pb_grpc.PolyindexServicer):
    def __init__(self, engine, metrics, limits: Limits = Limits(), member=None, models=None,
                 snapshot_root=None):
        """``member``: this process's place in a ``serve --processes N`` group
        (``service.group.Member``); a follower forwards every write to the group's writer.
        ``models``: which models a new collection may name (``service.models.ModelPolicy``;
        None: any, as the embedded engine). ``snapshot_root``: the folder CreateSnapshot writes
        under (None: snapshots are refused)."""
        self.engine, self.metrics, self.limits, self.models = engine, metrics, limits, models
        # remote clients never see the server's paths
        self.redact = Redactor(engine.path, snapshot_root)
        self.member = member
        self.snapshot_root = snapshot_root
        self.forwards = member is not None and member.forwards
        self.flight: collections.Counter = collections.Counter()  # calls running, by RPC
        self._flight_lock = threading.Lock()

    def in_flight(self) -> dict[str, int]:
        with self._flight_lock:
            return {rpc: n for rpc, n in self.flight.items() if n}

    def _forward(self, method: str, request, context, collection: str | None = None):
        """A follower's write: the writer answers; then this process catches up with the
        writer's WAL so that the client's next call here reads its write."""
        response = self.member.forward(method, request, context)
        if collection:
            try:
                self.engine.collection(collection).catch_up()
            except PolyindexError:  # dropped meanwhile: the write's answer stands
                pass
        return response

    # -- queries -----------------------------------------------------------------------------
    @_rpc
    def Query(self, req, context, tags):
        start = time.perf_counter()
        k = req.k if req.HasField("k") else 10
        if k > self.limits.max_k:
            raise ResourceExhausted(f"k must be an integer in 1..{self.limits.max_k}, got {k}")
        texts, vectors = self._queries(req)
        tokens = self._query_tokens(req)
        which = req.WhichOneof("rank_profile")
        lim = self.limits
        profile = (req.profile if which == "profile" else check_shape(
            "inline_profile", from_struct(req.inline_profile), lim.max_filter_nodes,
            lim.max_filter_depth) if which == "inline_profile" else None)
        flt = self._filter(req)
        fields = _fields(req)
        coll = self.engine.collection(req.collection)
        check_deadline(context, "the query ran")  # the work below is the expensive part
        # Collection.query's with_text brings the stored metadata too; each is sent if asked
        results = coll.query_batch(texts, vectors=vectors, tokens=tokens, k=k, profile=profile,
                                   filter=flt,
                                   explain=req.explain,
                                   with_text=req.with_text or req.with_metadata,
                                   using=req.using if req.HasField("using") else None,
                                   **({"allow_partial": True} if req.allow_partial else {}),
                                   **({"fields": fields} if fields is not None else {}))
        payload = {"text": req.with_text, "metadata": req.with_metadata or fields is not None}
        tags["profile"] = profile if isinstance(profile, str) else (
            "inline" if profile is not None else "default")
        resp = pb.QueryResponse()
        if req.batch:
            for hits in results:
                add_hits(resp.batch.add().hits, hits, **payload)
        else:
            add_hits(resp.hits, results[0], **payload)
        resp.unavailable_shards.extend(getattr(results, "unavailable_shards", ()))
        resp.took_ms = (time.perf_counter() - start) * 1000
        return resp

    def _filter(self, req) -> dict | None:
        """A request's filter (its shape checked), or None when unset."""
        if not req.HasField("filter"):
            return None
        return check_shape("filter", from_struct(req.filter), self.limits.max_filter_nodes,
                           self.limits.max_filter_depth)

    def _query_tokens(self, req):
        """Per query, its token matrix (or None when no query carries tokens)."""
        items = list(req.batch) if req.batch else [req]
        if not any(it.HasField("tokens") for it in items):
            return None
        out = []
        for i, it in enumerate(items):
            if not it.HasField("tokens"):
                raise InvalidArgument(f"query {i}: tokens are missing (every query of a batch "
                                      "has tokens or none does)")
            try:
                out.append(tokens_from_proto(it.tokens))
            except ValueError as e:
                raise InvalidArgument(f"query {i}: {e}") from None
        return out

    def _queries(self, req):
        """(texts | None, vectors | None) for query_batch, with the size limits checked."""
        lim = self.limits
        if not req.batch and not req.vector and not req.vectors and req.HasField("text"):
            # one text, no vectors (most calls): the checks below reduce to its length
            if len(req.text) > lim.max_text_chars:
                raise InvalidArgument(f"query 0: text is {len(req.text)} characters long "
                                      f"(max {lim.max_text_chars})")
            return [req.text], None
        if req.batch:
            if req.HasField("text") or req.vector or req.vectors:
                raise InvalidArgument("give either text/vector or batch, not both")
            if len(req.batch) > lim.max_batch:
                raise ResourceExhausted(f"batch: {len(req.batch)} queries in one call "
                                        f"(max {lim.max_batch})")
            items = list(req.batch)
        else:
            items = [req]
        texts = [it.text if it.HasField("text") else None for it in items]
        # np.array reads the repeated field in C (3 us for 384 floats; list() then asarray: 36)
        vectors = [np.array(it.vector, dtype=np.float32) if it.vector else None for it in items]
        for i, it in enumerate(items):
            if it.vectors:  # named fields: a dict per query ("dense" may be among them)
                named = vectors_from_proto(it.vectors)
                if vectors[i] is not None:
                    named.setdefault("dense", vectors[i])
                too_long = [f for f, v in named.items() if len(v) > lim.max_vector_dims]
                if too_long:
                    raise InvalidArgument(f"query {i}: vector {too_long[0]!r} has more than "
                                          f"{lim.max_vector_dims} dimensions")
                vectors[i] = named
        for i, (t, v) in enumerate(zip(texts, vectors)):
            if t is None and v is None and not items[i].HasField("tokens"):
                raise InvalidArgument("a query needs text or a vector" if not req.batch
                                      else f"query {i}: needs text or a vector")
            if t is not None and len(t) > lim.max_text_chars:
                raise InvalidArgument(f"query {i}: text is {len(t)} characters long "
                                      f"(max {lim.max_text_chars})")
            if v is not None and not isinstance(v, dict) and len(v) > lim.max_vector_dims:
                raise InvalidArgument(f"query {i}: vector has {len(v)} dimensions "
                                      f"(max {lim.max_vector_dims})")
        has_vec = [v is not None for v in vectors]
        if any(has_vec) and not all(has_vec):
            raise InvalidArgument("either every query of a batch has a vector or none does")
        return (None if all(t is None for t in texts) else texts,
                vectors if all(has_vec) else None)

    # -- writes ------------------------------------------------------------------------------
    @_rpc
    def Upsert(self, request_iterator, context, tags):
        if self.forwards:
            return self._forward_upsert(request_iterator, context)
        name, coll, records, size, expected = None, None, [], 0, None
        spec, bad_tokens = None, {}
        for msg in request_iterator:
            if msg.HasField("expected_total"):
                if expected is not None and msg.expected_total != expected:
                    raise InvalidArgument("expected_total differs between messages of the stream")
                expected = msg.expected_total
            size += msg.ByteSize()
            if size > self.limits.max_upsert_bytes:
                raise ResourceExhausted(f"Upsert stream over {self.limits.max_upsert_bytes} bytes; "
                                        "split it into several calls")
            if msg.collection and name is None:
                name, coll = msg.collection, self.engine.collection(msg.collection)  # fail fast
                spec = coll.vector_spec()  # every row's vectors checked, errors per row
            elif msg.collection and msg.collection != name:
                raise InvalidArgument(f"one Upsert stream names two collections: {name!r} and "
                                      f"{msg.collection!r}")
            check_count("Upsert documents", len(records) + len(msg.documents),
                        self.limits.max_upsert_records)
            for d in msg.documents:
                meta = from_struct(d.metadata) if d.HasField("metadata") else {}
                rec = {"id": d.id, "title": d.title, "text": d.text, "metadata": meta}
                if d.vectors:
                    rec["vectors"] = vectors_from_proto(d.vectors)
                if d.HasField("tokens"):  # a malformed matrix is this row's error
                    try:
                        rec["tokens"] = tokens_from_proto(d.tokens)
                    except ValueError as e:
                        bad_tokens[len(records)] = str(e)
                records.append(rec)
        if coll is None:
            raise InvalidArgument("the Upsert stream named no collection")
        received = len(records)
        if not context.is_active():  # cancelled: the stream may have been cut short
            raise Cancelled("Upsert was cancelled by the client; nothing was written")
        if expected is not None and expected != received:
            raise InvalidArgument(f"the Upsert stream carried {received} documents but "
                                  f"expected_total is {expected}; nothing was written")
        # Every bad row the same way (errors[], status OK), declared field types included
        docs, errors = [], []
        for i, rec in enumerate(records):
            if i in bad_tokens:
                errors.append((i, rec["id"], "tokens", bad_tokens[i]))
                continue
            doc = document_from_record(rec, source="Upsert", line=i + 1, fields=coll.config.fields,
                                       vectors=spec)
            if isinstance(doc, InputError):
                errors.append((i, rec["id"], doc.field or "", doc.reason))
            else:
                docs.append(doc)
        resp = pb.UpsertResponse(received=received, failed=len(errors))
        for i, doc_id, field, message in errors[:self.limits.max_row_errors]:
            resp.errors.add(index=i, id=doc_id, field=field, message=message)
        if errors:  # all or nothing: one bad row and nothing of the stream is written
            return resp
        check_deadline(context, "the documents were written")
        resp.upserted = coll.add(docs) if docs else 0
        return resp

    def _forward_upsert(self, request_iterator, context):
        """The stream is read whole first (as the writer holds it whole: all or nothing), so
        a stream that breaks here is answered here, not half-forwarded."""
        messages, size, name = [], 0, None
        for msg in request_iterator:
            size += msg.ByteSize()
            if size > self.limits.max_upsert_bytes:
                raise ResourceExhausted(f"Upsert stream over {self.limits.max_upsert_bytes} bytes; "
                                        "split it into several calls")
            name = name or msg.collection
            messages.append(msg)
        if not context.is_active():
            raise Cancelled("Upsert was cancelled by the client; nothing was written")
        return self._forward("Upsert", messages, context, name)  # a list: sent again on a retry

    @_rpc
    def Delete(self, req, context, tags):
        check_count("ids", len(req.ids), self.limits.max_ids)
        if self.forwards:
            return self._forward("Delete", req, context, req.collection)
        return pb.DeleteResponse(deleted=self.engine.collection(req.collection).delete(list(req.ids)))

    # -- reads -------------------------------------------------------------------------------
    @_rpc
    def Get(self, req, context, tags):
        check_count("ids", len(req.ids), self.limits.max_ids)
        docs = self.engine.collection(req.collection).get(list(req.ids),
                                                          with_vectors=req.with_vectors,
                                                          fields=_fields(req))
        resp = pb.GetResponse()
        for doc_id, doc in zip(req.ids, docs):
            resp.documents.append(doc_to_proto(doc) if doc is not None else pb.Document())
            resp.found.append(doc is not None)
            if doc is None:
                resp.missing_ids.append(doc_id)
        return resp

    # -- data operations ---------------------------------------------------------------------
    @_rpc
    def Count(self, req, context, tags):
        coll = self.engine.collection(req.collection)
        return pb.CountResponse(count=coll.count(self._filter(req)))

    @_rpc
    def DeleteWhere(self, req, context, tags):
        flt = self._filter(req)
        if flt is None:
            raise InvalidArgument("DeleteWhere needs a filter (to delete everything, drop the "
                                  "collection)")
        if self.forwards:
            return self._forward("DeleteWhere", req, context, req.collection)
        return pb.DeleteResponse(deleted=self.engine.collection(req.collection).delete_where(flt))

    @_rpc
    def Scroll(self, req, context, tags):
        limit = req.limit if req.HasField("limit") else 100
        if limit > self.limits.max_scroll:
            raise ResourceExhausted(f"scroll limit must be an integer in "
                                    f"1..{self.limits.max_scroll}, got {limit}")
        page = self.engine.collection(req.collection).scroll(
            filter=self._filter(req), limit=limit, cursor=req.cursor or None,
            fields=_fields(req), with_vectors=req.with_vectors)
        resp = pb.ScrollResponse(cursor=page.cursor or "")
        resp.documents.extend(doc_to_proto(d) for d in page.documents)
        return resp

    # -- admin -------------------------------------------------------------------------------
    @_rpc
    def CreateCollection(self, req, context, tags):
        if self.forwards:
            response = self._forward("CreateCollection", req, context)
            self.engine.forget(req.name)  # re-created: the old handle's folder is gone
            self._created(req.name)
            return response
        kw = {"fields": dict(req.fields), "exist_ok": req.exist_ok}
        for key in ("segment_size", "model", "dtype"):
            if req.HasField(key):
                kw[key] = getattr(req, key)
        if kw.get("model") == "none":
            kw["model"] = None
        elif "model" in kw and self.models is not None:  # never any server path a client names
            kw["model"] = self.models.check(kw["model"])
        if req.HasField("profiles"):
            kw["profiles"] = from_struct(req.profiles)
        coll = self.engine.create_collection(req.name, list(req.indexes) or DEFAULT_INDEXES, **kw)
        self._created(coll.name)
        return pb.CollectionInfo(name=coll.name, info=to_struct(self.redact.info(coll.info())))

    def _created(self, name: str) -> None:
        """A new collection's model loads now, not at its first query."""
        if self.models is not None:
            try:
                self.models.created(self.engine.collection(name))
            except PolyindexError:  # dropped meanwhile: nothing to load
                pass

    @_rpc
    def DropCollection(self, req, context, tags):
        if self.forwards:
            response = self._forward("DropCollection", req, context)
            self.engine.forget(req.name)  # the client's next call here reads its drop
            return response
        self.engine.drop_collection(req.name)
        return pb.DropCollectionResponse()

    @_rpc
    def ListCollections(self, req, context, tags):
        return pb.ListCollectionsResponse(names=self.engine.list_collections())

    @_rpc
    def DescribeCollection(self, req, context, tags):
        coll = self.engine.collection(req.name)
        return pb.CollectionInfo(name=coll.name, info=to_struct(self.redact.info(coll.info())))

    # -- snapshots (under ``serve --snapshot-root``; the writer writes them) ------------------
    def _snapshots(self):
        if self.snapshot_root is None:
            raise FailedPrecondition("this server keeps no snapshots: start it with `polyindex "
                                     "serve --snapshot-root DIR`")
        from polyindex.storage import restore
        return restore

    @_rpc
    def CreateSnapshot(self, req, context, tags):
        path = self._snapshots().snapshot_path(self.snapshot_root, req.name)
        if self.forwards:  # the writer seals its buffer first
            return self._forward("CreateSnapshot", req, context)
        s = self.engine.collection(req.collection).snapshot(path)
        return pb.SnapshotInfo(name=req.name, collection=s["collection"],
                               documents=s["documents"], segments=s["segments"],
                               files=s["files"], bytes=s["bytes"],
                               manifest_version=s["manifest_version"], seconds=s["seconds"],
                               created_at=time.time())

    @_rpc
    def AdaptCollection(self, req, context, tags):
        if self.forwards:  # the writer adapts (it holds the data directory's lock)
            return self._forward("AdaptCollection", req, context)
        r = self.engine.collection(req.collection).adapt(revert=req.revert,
                                                         recipe=dict(req.recipe) or None)
        return pb.AdaptCollectionResponse(
            collection=req.collection, encoder=r["encoder"], previous=r["previous"],
            documents=r["documents"], reencoded_rows=r["reencoded_rows"],
            delta_rows=r["delta_rows"], seconds=sum(r["seconds"].values()),
            report_json=json.dumps(r, default=str))

    @_rpc
    def ListSnapshots(self, req, context, tags):
        resp = pb.ListSnapshotsResponse()
        for s in self._snapshots().list_snapshots(self.snapshot_root):
            resp.snapshots.add(**{k: v for k, v in s.items() if v is not None})
        return resp

    @_rpc
    def DeleteSnapshot(self, req, context, tags):
        self._snapshots().delete(self.snapshot_root, req.name)
        return pb.DeleteSnapshotResponse()

    @_rpc
    def Stats(self, req, context, tags):
        names = [req.collection] if req.collection else self.engine.list_collections()
        resp = pb.StatsResponse(uptime_s=self.metrics.uptime())
        for name in names:
            coll = self.engine.collection(name)
            info = coll.info()
            resp.collections.add(name=name, documents=coll.count(), segments=info["segments"],
                                 deleted_rows=info["deleted_rows"],
                                 wal_bytes=info.get("wal_bytes") or 0)
        counts = self.metrics.counts()
        resp.requests.update(counts)
        resp.requests_total = sum(counts.values())
        m = self.member
        process_stats(resp.process, pid=os.getpid(), worker=m.worker if m else 0,
                      role=m.role if m else ("readonly" if self.engine.readonly else "writer"),
                      started=self.metrics.started, requests=counts,
                      restarts=m.restarts if m else 0)
        if req.processes:
            resp.processes.append(resp.process)
            for worker, answer in (m.peers(context) if m else []):
                if isinstance(answer, str):  # still who it is: its pid and role
                    resp.processes.add(worker=worker, error=answer, pid=m.pid_of(worker),
                                       role=m.role_of(worker))
                else:
                    resp.processes.append(answer.process)
            resp.processes.sort(key=lambda p: p.worker)
            for p in resp.processes:
                for rpc, n in p.requests.items():
                    resp.requests_all[rpc] += n
                resp.requests_all_total += p.requests_total
        return resp
