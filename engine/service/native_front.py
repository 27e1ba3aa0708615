"""The native gRPC front end's Python half: routes, request parsing, auth, the call context.

``polyindex.service._grpc_front`` (engine/service/native/grpc_front.cc, built by pip or ``make native``) is a gRPC C++
server. It answers health checks itself and hands every other call to ``Dispatcher`` as raw
bytes; the servicer methods run unchanged, against ``CallContext`` instead of grpcio's
``ServicerContext``. Reflection is grpcio-reflection's servicer, driven over the same path, so
the token check covers it as it does under grpcio.
"""
from __future__ import annotations

import atexit
import logging

import grpc
from google.protobuf.message import DecodeError

from polyindex.errors import InvalidArgument
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.service import reflection
from polyindex.service.auth import MESSAGE as AUTH_MESSAGE
from polyindex.service.auth import authorized, expected_header

log = logging.getLogger("polyindex.service.server")

try:
    from polyindex.service import _grpc_front
except ImportError as e:  # not built (``make native``) or its libraries are missing
    _grpc_front, IMPORT_ERROR = None, f"{type(e).__name__}: {e}"
else:
    IMPORT_ERROR = None
# What a user can do about it: pip builds the extension when it finds gRPC C++ (setup.py)
MISSING = (f"{IMPORT_ERROR}; install gRPC C++ (apt-get install libgrpc++-dev pkg-config) and "
           "reinstall polyindex (or `make native` in a source checkout), or use --frontend python")

_OK = grpc.StatusCode.OK.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]


def available() -> bool:
    return _grpc_front is not None


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class CallContext:
    """The part of ``grpc.ServicerContext`` the servicers use, over one native call."""

    __slots__ = ("_call", "trailers")

    def __init__(self, call):
        self._call, self.trailers = call, ()

    def invocation_metadata(self):
        return self._call.metadata()

    def time_remaining(self):
        return self._call.time_remaining()

    def is_active(self) -> bool:
        return self._call.is_active()

    def peer(self) -> str:
        return self._call.peer()

    def set_trailing_metadata(self, metadata) -> None:
        self.trailers = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str):
        raise _Abort(code, details)


class _Route:
    __slots__ = ("path", "name", "kind", "request", "handler")

    def __init__(self, path, kind, request, handler):
        self.path, self.kind, self.request, self.handler = path, kind, request, handler
        self.name = path.rsplit("/", 1)[-1]


def _messages(call, route):
    """The request stream of a streaming call, parsed."""
    i = 0
    while (payload := call.read()) is not None:
        try:
            yield route.request.FromString(payload)
        except DecodeError as e:
            raise InvalidArgument(f"{route.name}: message {i} of the stream is not a valid "
                                  f"{route.request.DESCRIPTOR.full_name} ({e})") from None
        i += 1


class Dispatcher:
    """Called by the C++ server for every call but health: ``(index, payload, call)`` in,
    ``(code, details, response bytes | None, trailers)`` out. Never raises."""

    def __init__(self, routes: list[_Route], token: str | None, on_reject=None):
        self.routes = routes
        self._expected = expected_header(token) if token else None
        self._on_reject = on_reject

    def __call__(self, index: int, payload: bytes | None, call):
        route = self.routes[index]
        if self._expected is not None and not authorized(call.metadata(), self._expected):
            if self._on_reject is not None:
                self._on_reject(route.path)
            return _UNAUTHENTICATED, AUTH_MESSAGE, None, ()
        ctx = CallContext(call)
        try:
            if route.kind == _grpc_front.UNARY:
                try:
                    request = route.request.FromString(payload)
                except DecodeError as e:
                    return (_INVALID, f"{route.name}: the request is not a valid "
                            f"{route.request.DESCRIPTOR.full_name} ({e})", None, ())
                return _OK, "", route.handler(request, ctx).SerializeToString(), ctx.trailers
            if route.kind == _grpc_front.CLIENT_STREAM:
                response = route.handler(_messages(call, route), ctx)
                return _OK, "", response.SerializeToString(), ctx.trailers
            for response in route.handler(_messages(call, route), ctx):  # bidi
                if not call.write(response.SerializeToString()):
                    break  # the client went away
            return _OK, "", None, ctx.trailers
        except _Abort as a:
            return a.code.value[0], a.details, None, ctx.trailers
        except Exception as e:  # noqa: BLE001 - servicers map their errors; this is a bug
            log.exception("%s failed in the gRPC front end", route.path)
            return _INTERNAL, f"internal error in {route.name}: {type(e).__name__}", None, ()


def routes(servicer, service_name: str) -> list[_Route]:
    """Every method of ``polyindex.v1.Polyindex``."""
    out = []
    for m in pb.DESCRIPTOR.services_by_name["Polyindex"].methods:
        if m.server_streaming:
            raise NotImplementedError(f"{m.full_name}: server streaming is not routed natively")
        kind = _grpc_front.CLIENT_STREAM if m.client_streaming else _grpc_front.UNARY
        out.append(_Route(f"/{service_name}/{m.name}", kind,
                          getattr(pb, m.input_type.name), getattr(servicer, m.name)))
    return out


def reflection_routes(service_names) -> list[_Route]:
    """Server reflection, v1 and v1alpha, answered by one servicer."""
    servicer = reflection.servicer(service_names)
    return [_Route(path, _grpc_front.BIDI, reflection.Request, servicer.ServerReflectionInfo)
            for path in reflection.paths()]


class NativeFront:
    """The C++ server, with the same small interface as the grpcio front in ``server.py``."""

    def __init__(self, servicer, service_name: str, health_name: str, bind: str, *,
                 token: str | None, on_reject, tls: tuple[bytes, bytes] | None,
                 workers: int, max_message_bytes: int, reuseport: bool = False,
                 private_bind: str | None = None):
        if _grpc_front is None:
            raise RuntimeError(f"the native gRPC front end is not available: {MISSING}")
        table = routes(servicer, service_name)
        table.extend(reflection_routes((service_name, health_name)))
        self._dispatch = Dispatcher(table, token, on_reject)
        # The group's two arguments only when used: an extension built before them (a stale
        # `make native`) still serves a lone server
        group = (int(reuseport), private_bind or "") if reuseport or private_bind else ()
        self._server = _grpc_front.start(self._dispatch, [(r.path, r.kind) for r in table], bind,
                                         max_message_bytes, workers, tls, [service_name], *group)
        self.port = self._server.port()
        atexit.register(self.stop, 0.0)  # C++ threads must not call into a finalizing Python

    def set_serving(self, serving: bool) -> None:
        # An extension built before set_serving (a stale `make native`) answers SERVING
        set_serving = getattr(self._server, "set_serving", None)
        if set_serving is not None:
            set_serving(bool(serving))

    def not_serving(self) -> None:
        self._server.not_serving()

    def stop(self, grace: float | None) -> None:
        atexit.unregister(self.stop)
        self._server.shutdown(0.0 if grace is None else float(grace))
