"""Run the gRPC service: ``serve(...)`` in-process, ``run(...)`` for ``polyindex serve``.

Binds to loopback unless told otherwise; port 0 picks a free port (``Server.port``). Besides
``polyindex.v1.Polyindex`` it registers the standard health service and server reflection so
any gRPC tool (grpcurl, load-balancer probes) can talk to it.
"""
from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from polyindex.affinity import parse_cpus, pin_process
from polyindex.auth import TokenAuth
from polyindex.convert import MAX_MESSAGE_BYTES
from polyindex.errors import Internal, InvalidArgument
from polyindex.metrics import Metrics
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.service import Limits, PolyindexService

SERVICE = pb.DESCRIPTOR.services_by_name["Polyindex"].full_name  # "polyindex.v1.Polyindex"


class Server:
    """A running server. ``stop(grace)`` lets in-flight calls finish, then closes the engine."""

    def __init__(self, grpc_server, engine, metrics, health_servicer, host, port, tls, metrics_port):
        self.grpc_server, self.engine, self.metrics = grpc_server, engine, metrics
        self._health, self.host, self.port, self.tls = health_servicer, host, port, tls
        self.metrics_port = metrics_port
        self._stopped = False

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def stop(self, grace: float | None = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._health.enter_graceful_shutdown()  # probes see NOT_SERVING while we drain
        self.grpc_server.stop(grace).wait()
        try:
            self.engine.close()  # flushes buffered (WAL) writes
        finally:
            self.metrics.stop_http()

    def wait(self, timeout: float | None = None) -> bool:
        return self.grpc_server.wait_for_termination(timeout)


def _read(value) -> bytes:
    return value if isinstance(value, bytes) else Path(value).read_bytes()


def serve(data_dir, host: str = "127.0.0.1", port: int = 50051, token: str | None = None,
          tls_cert=None, tls_key=None, workers: int = 8, metrics_port: int | None = None,
          max_message_bytes: int = MAX_MESSAGE_BYTES, limits: Limits = Limits(),
          engine=None) -> Server:
    """Start serving ``data_dir`` (or an already open ``engine``); returns at once."""
    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgument("TLS needs both a certificate and a key")
    if workers < 1:
        raise InvalidArgument(f"workers must be >= 1, got {workers}")
    if engine is None:
        from polyindex.engine import Engine
        engine = Engine(data_dir, online=True)
    metrics = Metrics(engine)
    interceptors = []
    if token:
        interceptors.append(TokenAuth(token, on_reject=lambda m: metrics.observe(
            m.rsplit("/", 1)[-1], "UNAUTHENTICATED", 0.0)))
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.so_reuseport", 0)]  # a busy port must fail, not be shared silently
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="polyindex-rpc"),
                         interceptors=interceptors, options=options)
    pb_grpc.add_PolyindexServicer_to_server(PolyindexService(engine, metrics, limits), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls_cert is not None:
            creds = grpc.ssl_server_credentials([(_read(tls_key), _read(tls_cert))])
            bound = server.add_secure_port(bind, creds)
        else:
            bound = server.add_insecure_port(bind)
    except RuntimeError as e:  # grpc raises RuntimeError when it cannot bind
        raise Internal(f"cannot listen on {bind}: {e}") from None
    if not bound:
        raise Internal(f"cannot listen on {bind}")
    bound_metrics = metrics.start_http(metrics_port) if metrics_port is not None else None
    server.start()
    return Server(server, engine, metrics, health_servicer, host, bound, tls_cert is not None,
                  bound_metrics)


def run(data_dir, *, token_file=None, grace: float = 5.0, cpus: str | None = None, **kw) -> None:
    """Serve until SIGTERM/SIGINT, then stop gracefully (``polyindex serve``). ``cpus``
    (e.g. ``"1"`` or ``"0-3"``) pins the process before any server thread starts."""
    if cpus is not None:
        pin_process(parse_cpus(cpus))
    token = None
    if token_file is not None:
        token = Path(token_file).read_text().strip()
        if not token:
            raise InvalidArgument(f"token file {token_file} is empty")
    srv = serve(data_dir, token=token, **kw)
    extras = [x for x in ("tls" if srv.tls else "", "token" if token else "",
                          f"cpus {cpus}" if cpus is not None else "",
                          f"metrics on 127.0.0.1:{srv.metrics_port}" if srv.metrics_port else "") if x]
    print(f"polyindex serving on {srv.address}" + (f" ({', '.join(extras)})" if extras else ""),
          flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    srv.stop(grace)
