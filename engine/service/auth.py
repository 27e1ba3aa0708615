"""Bearer-token authentication: a server interceptor in front of every RPC but health checks.

Load balancers and orchestrators probe ``grpc.health.v1.Health`` without credentials, so it
stays open; everything else (including reflection) needs ``authorization: Bearer <token>``.
"""
from __future__ import annotations

import hmac
from typing import Callable

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
MESSAGE = "missing or invalid bearer token (send metadata 'authorization: Bearer <token>')"


class TokenAuth(grpc.ServerInterceptor):
    def __init__(self, token: str, on_reject: Callable[[str], None] | None = None):
        self._expected = expected_header(token)
        self._on_reject = on_reject

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_PREFIXES) or self._authorized(handler_call_details):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return None
        if self._on_reject is not None:
            self._on_reject(method)
        return _denying(handler)

    def _authorized(self, details) -> bool:
        return authorized(details.invocation_metadata, self._expected)


def expected_header(token: str) -> bytes:
    """The ``authorization`` value a client must send for ``token``."""
    if not token:
        raise ValueError("the token must be a non-empty string")
    return f"Bearer {token}".encode()


def authorized(metadata, expected: bytes) -> bool:
    """Whether ``metadata`` ((key, value) pairs) carries ``expected`` as its authorization."""
    for key, value in metadata or ():
        if key == "authorization":
            got = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
            return hmac.compare_digest(got, expected)  # constant time
    return False


def _deny(request_or_iterator, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that only says UNAUTHENTICATED."""
    kw = {"request_deserializer": handler.request_deserializer,
          "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_deny_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(_deny, **kw)


def _deny_stream(request_or_iterator, context):
    _deny(request_or_iterator, context)
    yield  # pragma: no cover - a generator, as streaming handlers must be
