"""The one place where polyindex exceptions and gRPC status codes meet (both directions).

Server side: an exception's ``.status`` name is its status code; the class name and, for a
located ``InputError``, its fields travel in trailing metadata so the client re-raises the very
same class with the very same message. Client side: a status code (and that metadata) becomes
the exception the embedded engine would have raised.
"""
from __future__ import annotations

import json
import logging

import grpc

from polyindex import errors
from polyindex.errors import InputError, Internal, PolyindexError

log = logging.getLogger("polyindex.service.server")

CLASS_KEY = "polyindex-error"
DETAIL_KEY = "polyindex-error-detail"
_INPUT_FIELDS = ("source", "line", "field", "doc_id")


class DeadlineExceeded(PolyindexError, TimeoutError):
    """The call's deadline passed (remote calls only)."""

    status = "DEADLINE_EXCEEDED"


class Unavailable(PolyindexError, ConnectionError):
    """The server could not be reached (after retries, for idempotent calls)."""

    status = "UNAVAILABLE"


Cancelled = errors.Cancelled  # raised by the engine's long work too (``errors.check_cancelled``)


_CLASSES = {cls.__name__: cls for cls in (
    *errors.STATUS_NAMES, InputError, PolyindexError, DeadlineExceeded, Unavailable)}
_BY_CODE = {"INVALID_ARGUMENT": errors.InvalidArgument, "NOT_FOUND": errors.NotFound,
            "ALREADY_EXISTS": errors.AlreadyExists, "UNAUTHENTICATED": errors.Unauthenticated,
            "PERMISSION_DENIED": errors.Unauthenticated,
            "RESOURCE_EXHAUSTED": errors.ResourceExhausted, "DATA_LOSS": errors.Corrupt,
            "FAILED_PRECONDITION": errors.FailedPrecondition,
            "DEADLINE_EXCEEDED": DeadlineExceeded, "UNAVAILABLE": Unavailable,
            "CANCELLED": Cancelled, "INTERNAL": Internal}


def status_code(exc: PolyindexError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.status, grpc.StatusCode.INTERNAL)


def as_polyindex_error(exc: BaseException, rpc: str) -> PolyindexError:
    """Our exceptions as they are; anything else is a bug: log it, answer INTERNAL briefly."""
    if isinstance(exc, PolyindexError):
        return exc
    if isinstance(exc, grpc.RpcError):  # reading a request stream the client cancelled
        log.info("%s: the client cancelled the call", rpc)
        return Cancelled(f"{rpc} was cancelled by the client")
    if errors.is_disk_full(exc):
        log.error("%s: %s", rpc, exc)
        return errors.disk_full(exc, rpc, "nothing of it was kept", path=False)
    if isinstance(exc, MemoryError):  # a limit missed something: the call fails, not the server
        log.error("%s: out of memory", rpc)
        return errors.ResourceExhausted(f"{rpc}: the server ran out of memory for this request")
    log.exception("%s failed with an unexpected error", rpc, exc_info=exc)
    return Internal(f"internal error in {rpc}: {type(exc).__name__} (see the server log)")


def abort(context: grpc.ServicerContext, exc: PolyindexError):
    """End the call with the exception's status; raises (as ``context.abort`` does)."""
    trailers = [(CLASS_KEY, type(exc).__name__)]
    if isinstance(exc, InputError):
        detail = {k: getattr(exc, k) for k in _INPUT_FIELDS}
        detail["reason"] = exc.reason
        trailers.append((DETAIL_KEY, json.dumps(detail)))  # ASCII: metadata must be
    context.set_trailing_metadata(trailers)
    context.abort(status_code(exc), str(exc))


def from_rpc_error(err: grpc.RpcError) -> PolyindexError:
    """The exception the embedded engine would have raised for this failed call."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else None
    trailers = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
    return from_status(code, message, trailers)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def code_of(value: int) -> grpc.StatusCode:
    """The status code with this number (UNKNOWN for a number gRPC does not define)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def from_status(code: grpc.StatusCode, message: str | None, trailers: dict) -> PolyindexError:
    """The exception for a failed call's status code, message and trailing metadata."""
    message = message or str(code)
    cls = _CLASSES.get(trailers.get(CLASS_KEY)) or _BY_CODE.get(code.name)
    if cls is None:
        return Internal(f"{code.name}: {message}")
    if cls is InputError and DETAIL_KEY in trailers:
        try:
            d = json.loads(trailers[DETAIL_KEY])
            return InputError(d["reason"], **{k: d.get(k) for k in _INPUT_FIELDS})
        except (ValueError, KeyError, TypeError):
            pass  # a malformed detail: fall back to the plain message below
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    if isinstance(exc, InputError):
        exc.source = exc.line = exc.field = exc.doc_id = None
        exc.reason = message
    return exc
