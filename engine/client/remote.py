"""The remote client: ``Client(address).collection(name)`` has the embedded Collection's API.

Errors come back as the same exception classes (and messages) the embedded engine raises.
Idempotent calls (Query, Get, Delete, Describe, List, Stats) are retried on UNAVAILABLE with
exponential backoff and jitter (a retried Delete counts only what its last attempt deleted).
Upsert is never retried: it waits until the channel is connected
(so a stream is not lost to a server that is still starting) and is then sent once.

``add(docs)`` validates every document locally first (as the embedded ``add`` does, same
errors), then streams them in batches as ONE Upsert call, which the server applies all or
nothing. If the connection breaks before the reply, ``Unavailable`` is raised and the write may
or may not have happened; upserts are idempotent, so calling ``add`` again is safe.

Transport (``transport=``): unary calls go over a gRPC C++ channel (``polyindex._grpc_channel``,
built by ``make native``) when it is built, about 0.25 ms faster a call than grpcio's; the
Upsert stream and the connection check always use grpcio. ``"python"`` uses grpcio for all.
"""
from __future__ import annotations

import json

import random
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from polyindex.config import DEFAULT_INDEXES, DEFAULT_MODEL, validate_name
from polyindex.errors import InputError, InvalidArgument, ResourceExhausted
from polyindex.ingest.records import document_from_record
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.types import MAX_K, Document, Hit, HitLists, Page, Ranking, check_fields
from polyindex.wire.convert import (
    MAX_MESSAGE_BYTES,
    doc_from_proto,
    doc_to_proto,
    from_struct,
    hit_from_proto,
    put_tokens,
    to_struct,
)
from polyindex.wire.grpc_errors import Unavailable, code_of, from_rpc_error, from_status

UPSERT_BATCH = 256  # documents per stream message
QUERY_BATCH = 1024  # queries per Query call (the server's limit)
CONNECT_TIMEOUT = 10.0  # how long add() waits for a connection before its one attempt
_INT64_MAX = 2 ** 63 - 1
_SERVICE = pb.DESCRIPTOR.services_by_name["Polyindex"]
_UNARY = {m.name: (f"/{_SERVICE.full_name}/{m.name}", getattr(pb, m.output_type.name))
          for m in _SERVICE.methods if not m.client_streaming}
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]

try:
    from polyindex.client import _grpc_channel
except ImportError:  # not built (no gRPC C++ at install): grpcio carries every call
    _grpc_channel = None
TRANSPORTS = ("auto", "native", "python")


class Client:
    def __init__(self, address: str = "127.0.0.1:50051", token: str | None = None, tls=None,
                 timeout: float = 30.0, retries: int = 3, backoff: float = 0.1,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, transport: str = "auto"):
        """``tls``: None (plaintext), True (system roots), or a CA certificate (path or bytes).
        ``transport``: "native" (gRPC C++ for unary calls), "python" (grpcio) or "auto"."""
        if transport not in TRANSPORTS:
            raise InvalidArgument(f"transport must be one of {', '.join(TRANSPORTS)}, "
                                  f"got {transport!r}")
        if transport == "native" and _grpc_channel is None:
            raise InvalidArgument("the native gRPC channel is not available (install gRPC C++: "
                                  "apt-get install libgrpc++-dev pkg-config, and reinstall "
                                  "polyindex, or `make native` in a source checkout); "
                                  "use transport='python'")
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        secure = tls is not None and tls is not False
        root = None if not secure or tls is True else (
            tls if isinstance(tls, bytes) else Path(tls).read_bytes())
        if secure:
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root), options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._native = None
        if transport != "python" and _grpc_channel is not None:
            self._native = _grpc_channel.Channel(address, secure, root, max_message_bytes)
        self.transport = "python" if self._native is None else "native"
        self._stub = pb_grpc.PolyindexStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.address, self.timeout, self.retries, self.backoff = address, timeout, retries, backoff

    # -- plumbing ----------------------------------------------------------------------------
    def _call(self, method: str, request, *, timeout: float | None = None, retry=True):
        """One RPC, retried on UNAVAILABLE when ``retry`` (the call is idempotent)."""
        native = self._native is not None and method in _UNARY
        for attempt in range(self.retries + 1):
            req = request() if callable(request) else request
            wait = self.timeout if timeout is None else timeout
            if native:
                path, response = _UNARY[method]
                code, details, body, trailers = self._native.unary(
                    path, req.SerializeToString(), wait, self._metadata)
                if code == 0:
                    return response.FromString(body)
                if code != _UNAVAILABLE or not retry or attempt == self.retries:
                    raise from_status(code_of(code), details, dict(trailers))
            else:
                try:
                    return getattr(self._stub, method)(req, timeout=wait, metadata=self._metadata)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE or not retry or attempt == self.retries:
                        raise from_rpc_error(e) from None
            delay = min(2.0, self.backoff * 2 ** attempt)
            time.sleep(random.uniform(0, delay))  # full jitter: retries of many clients spread out

    def _connected(self, timeout: float | None = None) -> None:
        """Wait (up to CONNECT_TIMEOUT) until the channel is connected, or raise Unavailable.

        A health check with wait_for_ready (every polyindex server has one, exempt from auth)
        rather than grpc.channel_ready_future, whose polling thread can outlive close() and
        then fail on the closed channel."""
        wait = min(self.timeout, CONNECT_TIMEOUT) if timeout is None else timeout
        try:
            self._health.Check(health_pb2.HealthCheckRequest(), timeout=wait, wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # a server without health: connected
                return
            raise Unavailable(f"cannot connect to {self.address} (waited {wait:g} s)") from None

    # -- collections -------------------------------------------------------------------------
    def collection(self, name: str) -> "RemoteCollection":
        """Like ``Engine.collection``: raises NotFound for an unknown collection."""
        validate_name(name)
        info = self._call("DescribeCollection", pb.DescribeCollectionRequest(name=name)).info
        return RemoteCollection(self, name, _fields_of(info))

    def create_collection(self, name: str, indexes: Sequence[str] = DEFAULT_INDEXES, *,
                          model: str | None = DEFAULT_MODEL, dtype: str = "auto",
                          segment_size: int = 50_000, fields: dict[str, str] | None = None,
                          profiles: dict[str, dict] | None = None,
                          exist_ok: bool = False) -> "RemoteCollection":
        try:
            req = pb.CreateCollectionRequest(name=name, indexes=list(indexes), fields=fields or {},
                                             segment_size=segment_size,
                                             model="none" if model is None else model, dtype=dtype,
                                             exist_ok=exist_ok)
        except (TypeError, ValueError) as e:  # a wrongly typed argument (protobuf is strict)
            raise InvalidArgument(f"create_collection: {e}") from None
        if profiles:
            req.profiles.CopyFrom(_struct(profiles, "profiles"))
        # Not retried: a create that landed would come back ALREADY_EXISTS on the retry.
        info = self._call("CreateCollection", req, retry=False).info
        return RemoteCollection(self, name, _fields_of(info))

    def drop_collection(self, name: str) -> None:
        self._call("DropCollection", pb.DropCollectionRequest(name=name), retry=False)

    def list_collections(self) -> list[str]:
        return list(self._call("ListCollections", pb.ListCollectionsRequest()).names)

    def stats(self, processes: bool = False) -> dict:
        """Counts of the process that answers (``process``: its pid and role); with
        ``processes``, every process of the server too (``polyindex serve --processes N``),
        and ``requests_all`` summed over them."""
        r = self._call("Stats", pb.StatsRequest(processes=processes))
        out = {"uptime_s": r.uptime_s, "requests": dict(r.requests),
               "requests_total": r.requests_total, "process": _process(r.process),
               "collections": {c.name: {"documents": c.documents, "segments": c.segments,
                                        "deleted_rows": c.deleted_rows, "wal_bytes": c.wal_bytes}
                               for c in r.collections}}
        if processes:
            out.update(processes=[_process(p) for p in r.processes],
                       requests_all=dict(r.requests_all), requests_all_total=r.requests_all_total)
        return out

    def health(self) -> str:
        """The server's ``grpc.health.v1`` status: SERVING, NOT_SERVING (its models still
        loading, or draining) or UNKNOWN; Unavailable when it cannot be reached."""
        try:
            r = self._health.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    def list_snapshots(self) -> list[dict]:
        """The snapshots the server keeps under its ``--snapshot-root``."""
        return [_snapshot(s) for s in self._call("ListSnapshots",
                                                 pb.ListSnapshotsRequest()).snapshots]

    def delete_snapshot(self, name: str) -> None:
        self._call("DeleteSnapshot", pb.DeleteSnapshotRequest(name=name), retry=False)

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _process(p) -> dict:
    return {"pid": p.pid, "role": p.role, "worker": p.worker, "uptime_s": p.uptime_s,
            "requests": dict(p.requests), "requests_total": p.requests_total,
            "restarts": p.restarts, "error": p.error}


def _snapshot(s) -> dict:
    out = {"name": s.name, "collection": s.collection, "documents": s.documents,
           "segments": s.segments, "files": s.files, "bytes": s.bytes,
           "manifest_version": s.manifest_version, "created_at": s.created_at}
    if s.seconds:
        out["seconds"] = s.seconds
    if s.problem:
        out["problem"] = s.problem
    return out


def _fields_of(info) -> dict[str, str]:
    """The declared fields from a CollectionInfo: their types let floats come back as floats."""
    fields = from_struct(info).get("fields")
    return dict(fields) if isinstance(fields, dict) else {}


def _struct(data, what: str):
    try:
        return to_struct(data)
    except ValueError as e:
        raise InvalidArgument(f"{what}: {e}") from None


def _doc(obj: Any, i: int) -> Document:
    """The embedded ``add``'s validation: Documents as they are, dicts checked and flattened."""
    if isinstance(obj, Document):
        return obj
    if not isinstance(obj, dict):
        raise InputError(f"document must be a dict, got {type(obj).__name__}", line=i + 1)
    doc = document_from_record(obj, source="add()", line=i + 1)
    if isinstance(doc, InputError):
        raise doc
    return doc


class RemoteCollection:
    """The embedded ``Collection`` API over gRPC."""

    def __init__(self, client: Client, name: str, fields: dict[str, str] | None = None):
        self.client, self.name, self.fields = client, name, dict(fields or {})

    def query(self, text: str | None = None, *, vector=None, using: str | None = None,
              tokens=None,
              k: int = 10, profile=None, filter: dict | None = None, explain: bool = False,
              with_text: bool = False, with_metadata: bool | None = None,
              fields: Sequence[str] | None = None, timeout: float | None = None) -> list[Hit]:
        """``with_text``: hits carry title and text; ``with_metadata``: their metadata (None:
        the same as ``with_text``, as the embedded ``Collection.query`` does). ``vector``: a
        list/array (the unnamed field, or ``using``'s) or a dict field -> vector."""
        req = self._request(k, profile, filter, explain, with_text, with_metadata, using)
        _put_fields(req, fields)
        resp = self.client._call("Query", _put_query(req, text, vector, tokens),
                                 timeout=timeout)
        return [hit_from_proto(h, self.fields) for h in resp.hits]

    def query_ids(self, text: str | None = None, *, vector=None, using: str | None = None,
                  tokens=None, k: int = 10, profile=None, filter: dict | None = None,
                  timeout: float | None = None) -> Ranking:
        """``query``'s ids and scores as arrays (``types.Ranking``), no ``Hit`` objects."""
        req = _put_query(self._request(k, profile, filter, False, False, False, using), text,
                         vector, tokens)
        hits = self.client._call("Query", req, timeout=timeout).hits
        return Ranking([h.id for h in hits], np.array([h.score for h in hits], np.float64))

    def query_batch(self, texts: Sequence[str] | None = None, *, vectors=None,
                    using: str | None = None, tokens=None, k: int = 10,
                    profile=None, filter: dict | None = None, explain: bool = False,
                    with_text: bool = False, with_metadata: bool | None = None,
                    fields: Sequence[str] | None = None, timeout: float | None = None,
                    allow_partial: bool = False) -> HitLists:
        """``allow_partial``: a sharded collection answers from the shards that are up and
        names the others in the result's ``unavailable_shards`` (else: UNAVAILABLE)."""
        n = len(texts) if texts is not None else len(vectors) if vectors is not None else \
            len(tokens) if tokens is not None else 0
        if texts is not None and vectors is not None and len(vectors) != n:
            raise InvalidArgument(f"{n} query texts but {len(vectors)} vectors")
        if tokens is not None and len(tokens) != n:
            raise InvalidArgument(f"{n} queries but {len(tokens)} token matrices")
        if texts is None and vectors is None and tokens is None:
            raise InvalidArgument("a query needs text or a vector (or tokens)")
        if n == 0:
            raise InvalidArgument("no queries given")
        out = HitLists()
        down: set[int] = set()
        for start in range(0, n, QUERY_BATCH):
            req = self._request(k, profile, filter, explain, with_text, with_metadata, using)
            req.allow_partial = bool(allow_partial)
            _put_fields(req, fields)
            for i in range(start, min(n, start + QUERY_BATCH)):
                item = req.batch.add()
                if texts is not None and texts[i] is not None:
                    item.text = _text(texts[i], i)
                if vectors is not None:
                    _put_vector(item, vectors[i], i)
                if tokens is not None:
                    _put_tokens(item, tokens[i], i)
            resp = self.client._call("Query", req, timeout=timeout)
            out.extend([hit_from_proto(h, self.fields) for h in hl.hits] for hl in resp.batch)
            down.update(resp.unavailable_shards)
        out.unavailable_shards = tuple(sorted(down))
        return out

    def _request(self, k, profile, filter, explain, with_text, with_metadata,
                 using=None) -> pb.QueryRequest:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= _INT64_MAX:
            # the server checks 1..10000; here only what cannot travel as an int64
            raise (ResourceExhausted if isinstance(k, int) and not isinstance(k, bool) and k > 1
                   else InvalidArgument)(f"k must be an integer in 1..{MAX_K}, got {k!r}")
        if with_metadata is None:
            with_metadata = with_text
        req = pb.QueryRequest(collection=self.name, k=k, explain=bool(explain),
                              with_text=bool(with_text), with_metadata=bool(with_metadata))
        if using is not None:
            if not isinstance(using, str):
                raise InvalidArgument(f"using must be a vector field name, got {using!r}")
            req.using = using
        if isinstance(profile, dict):
            req.inline_profile.CopyFrom(_struct(profile, "profile"))
        elif profile is not None:
            if not isinstance(profile, str):
                raise InvalidArgument(f"profile must be a name or a dict, got {type(profile).__name__}")
            req.profile = profile
        if filter is not None:
            req.filter.CopyFrom(_filter(filter))
        return req

    def add(self, docs: Iterable[Any]) -> int:
        """Upsert documents as one all-or-nothing call; returns the number of distinct ids."""
        msgs = []
        for i, d in enumerate(docs):
            doc = _doc(d, i)
            try:
                msgs.append(doc_to_proto(doc))
            except ValueError as e:
                raise InputError(f"metadata {e}", source="add()", line=i + 1, doc_id=doc.id) from None
        if not msgs:
            return 0

        def stream():
            for start in range(0, len(msgs), UPSERT_BATCH):
                yield pb.UpsertRequest(collection=self.name, documents=msgs[start:start + UPSERT_BATCH],
                                       expected_total=len(msgs) if start == 0 else None)
        # gRPC pulls the first message before it connects, so "never sent" cannot be told
        # after a failure: connect first, then send once (the caller decides on a retry).
        self.client._connected()
        resp = self.client._call("Upsert", stream, retry=False)
        if resp.errors:
            first = resp.errors[0]
            exc = InputError(first.message, source="add()", line=first.index + 1,
                             field=first.field or None, doc_id=first.id or None)
            exc.errors = [(e.index, e.id, e.field, e.message) for e in resp.errors]
            raise exc
        return resp.upserted

    def delete(self, ids: Sequence[str]) -> int:
        ids = _check_ids(ids)
        return self.client._call("Delete", pb.DeleteRequest(collection=self.name, ids=ids)).deleted

    def get(self, ids: Sequence[str], *, with_vectors: bool = False,
            fields: Sequence[str] | None = None) -> list[Document | None]:
        ids = _check_ids(ids)
        req = pb.GetRequest(collection=self.name, ids=ids, with_vectors=bool(with_vectors))
        _put_fields(req, fields)
        resp = self.client._call("Get", req)
        return [doc_from_proto(d, self.fields) if found else None
                for d, found in zip(resp.documents, resp.found)]

    def delete_where(self, filter: dict) -> int:
        """Delete what matches ``filter`` (retried on UNAVAILABLE: a retry deletes, and
        counts, what still matches)."""
        return self.client._call("DeleteWhere", pb.DeleteWhereRequest(
            collection=self.name, filter=_filter(filter))).deleted

    def scroll(self, *, filter: dict | None = None, limit: int = 100, cursor: str | None = None,
               fields: Sequence[str] | None = None, with_vectors: bool = False) -> Page:
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= _INT64_MAX:
            raise InvalidArgument(f"scroll limit must be an integer in 1..10000, got {limit!r}")
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidArgument(f"scroll cursor must be a string, got {type(cursor).__name__}")
        req = pb.ScrollRequest(collection=self.name, limit=limit, cursor=cursor or "",
                               with_vectors=bool(with_vectors))
        if filter is not None:
            req.filter.CopyFrom(_filter(filter))
        _put_fields(req, fields)
        resp = self.client._call("Scroll", req)
        return Page([doc_from_proto(d, self.fields) for d in resp.documents], resp.cursor or None)

    def count(self, filter: dict | None = None) -> int:
        if filter is not None:
            return self.client._call("Count", pb.CountRequest(collection=self.name,
                                                              filter=_filter(filter))).count
        resp = self.client._call("Stats", pb.StatsRequest(collection=self.name))
        return resp.collections[0].documents

    def info(self) -> dict:
        resp = self.client._call("DescribeCollection", pb.DescribeCollectionRequest(name=self.name))
        return from_struct(resp.info)

    def snapshot(self, path: str, *, timeout: float | None = None) -> dict:
        """Write a snapshot named ``path`` (a plain name) under the server's
        ``--snapshot-root``; it holds every write acknowledged before the call."""
        if not isinstance(path, str):
            raise InvalidArgument("a remote snapshot is named by a plain name (a str), "
                                  f"got {type(path).__name__}")
        resp = self.client._call("CreateSnapshot", pb.CreateSnapshotRequest(
            collection=self.name, name=path), timeout=timeout, retry=False)
        return {**_snapshot(resp), "path": path}

    def adapt(self, *, revert: bool = False, recipe: dict | None = None,
              timeout: float | None = None) -> dict:
        """The server adapts the collection (``Collection.adapt``); minutes on a CPU: give a
        ``timeout`` long enough, or none."""
        resp = self.client._call("AdaptCollection", pb.AdaptCollectionRequest(
            collection=self.name, revert=revert,
            recipe={k: json.dumps(v) for k, v in (recipe or {}).items()}),
            timeout=timeout, retry=False)
        return json.loads(resp.report_json)

    def __repr__(self) -> str:
        return f"RemoteCollection({self.name!r} at {self.client.address})"


def _filter(filter) -> Any:
    if not isinstance(filter, dict) or not filter:
        raise InvalidArgument(f"filter must be a non-empty JSON object, got {filter!r}")
    return _struct(filter, "filter")


def _put_fields(req, fields) -> None:
    fields = check_fields(fields)
    if fields is not None:
        req.fields.names.extend(fields)


def _check_ids(ids) -> list[str]:
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument("ids must be a list of strings")
    return list(ids)


def _text(text, i: int) -> str:
    if not isinstance(text, str):
        raise InvalidArgument(f"query {i}: text must be a non-empty string")
    return text


def _put_query(req, text, vector, tokens):
    """A one-query request's text, vector and tokens (those given); the request."""
    if text is not None:
        req.text = _text(text, 0)
    if vector is not None:
        _put_vector(req, vector, 0)
    if tokens is not None:
        _put_tokens(req, tokens, 0)
    return req


def _put_vector(msg, vector, i: int) -> None:
    """A query's vector into a QueryRequest or QueryItem: a dict goes to ``vectors``."""
    if isinstance(vector, dict):
        for name, v in vector.items():
            msg.vectors[str(name)].values.extend(_vector(v, i))
    else:
        msg.vector.extend(_vector(vector, i))


def _put_tokens(msg, tokens, i: int) -> None:
    """A query's token matrix into a QueryRequest or QueryItem (checked by the server)."""
    try:
        put_tokens(msg.tokens, tokens)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"query {i}: {e}") from None


def _vector(vector, i: int) -> list[float]:
    try:
        v = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidArgument(f"query {i}: vector must be a sequence of numbers") from None
    if v.ndim != 1:
        raise InvalidArgument(f"query {i}: vector must be one-dimensional, got shape {v.shape}")
    return v.tolist()
