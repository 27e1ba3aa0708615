"""Run the gRPC service: ``serve(...)`` in-process, ``run(...)`` for ``polyindex serve``.

Binds to loopback unless told otherwise; port 0 picks a free port (``Server.port``). Besides
``polyindex.v1.Polyindex`` it registers the standard health service and server reflection so
any gRPC tool (grpcurl, load-balancer probes) can talk to it. Two front ends carry the same
servicer: gRPC C++ (``polyindex.service.native_front``, when built) and grpcio's Python server.
"""
from __future__ import annotations

import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from polyindex.errors import Internal, InvalidArgument
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.service import native_front, reflection
from polyindex.service.affinity import parse_cpus, pin_process
from polyindex.service.auth import TokenAuth
from polyindex.service.metrics import Metrics
from polyindex.service.exposure import check_exposure
from polyindex.service.models import ModelLoader, ModelPolicy, collection_models
from polyindex.service.ports import check_free
from polyindex.service.servicer import Limits, PolyindexService
from polyindex.service.shutdown import stop_bounded
from polyindex.wire.convert import MAX_MESSAGE_BYTES

SERVICE = pb.DESCRIPTOR.services_by_name["Polyindex"].full_name  # "polyindex.v1.Polyindex"
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class Server:
    """A running server. ``stop(grace)`` lets in-flight calls finish, then closes the engine."""

    def __init__(self, front, engine, metrics, host, tls, metrics_port):
        self.front, self.engine, self.metrics = front, engine, metrics
        self.host, self.port, self.tls, self.metrics_port = host, front.port, tls, metrics_port
        self.frontend = front.name
        self.member = None  # set by serve() for a worker of `serve --processes N`
        self.models_ready = threading.Event()  # set by serve(): the served models are loaded
        self.service = None  # the servicer, set by serve()
        self._stopped = threading.Event()

    def in_flight(self) -> dict[str, int]:
        """Calls running now, by RPC."""
        return self.service.in_flight() if self.service is not None else {}

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def stop(self, grace: float | None = 5.0) -> None:
        if self._stopped.is_set():
            return
        try:
            self.front.not_serving()  # probes see NOT_SERVING while we drain
            self.front.stop(grace)
            self.engine.close()  # flushes buffered (WAL) writes
        finally:
            self.metrics.stop_http()
            if self.member is not None:
                self.member.close()
            self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped; False if ``timeout`` passed first."""
        return self._stopped.wait(timeout)


class GrpcioFront:
    """grpcio's Python server: the fallback where the native front end is not built."""

    name = "python"

    def __init__(self, servicer, bind: str, *, token, on_reject, tls, workers, max_message_bytes,
                 reuseport: bool = False, private_bind: str | None = None):
        interceptors = [TokenAuth(token, on_reject=on_reject)] if token else []
        # A busy port must fail, not be shared silently; the processes of one server share
        # theirs on purpose (``service.supervisor`` checked that no other program holds it).
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.so_reuseport", int(reuseport))]
        server = grpc.server(ThreadPoolExecutor(max_workers=workers,
                                                thread_name_prefix="polyindex-rpc"),
                             interceptors=interceptors, options=options)
        pb_grpc.add_PolyindexServicer_to_server(servicer, server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        for name in ("", SERVICE):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflector = reflection.servicer((SERVICE, HEALTH))
        handler = grpc.stream_stream_rpc_method_handler(
            reflector.ServerReflectionInfo, request_deserializer=reflection.Request.FromString,
            response_serializer=reflection.Response.SerializeToString)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            name, {reflection.METHOD: handler}) for name in reflection.NAMES])
        try:
            if tls is not None:
                self.port = server.add_secure_port(bind, grpc.ssl_server_credentials([tls]))
            else:
                self.port = server.add_insecure_port(bind)
            if private_bind and not server.add_insecure_port(private_bind):
                raise RuntimeError("bind failed")
        except RuntimeError as e:  # grpc raises RuntimeError when it cannot bind
            raise Internal(f"cannot listen on {bind}: {e}") from None
        if not self.port:
            raise Internal(f"cannot listen on {bind}")
        server.start()
        self._server = server

    def set_serving(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE):  # ignored once not_serving() was called
            self._health.set(name, status)

    def not_serving(self) -> None:
        self._health.enter_graceful_shutdown()

    def stop(self, grace: float | None) -> None:
        self._server.stop(grace).wait()


class NativeFront(native_front.NativeFront):
    name = "native"

    def __init__(self, servicer, bind: str, **kw):
        try:
            super().__init__(servicer, SERVICE, HEALTH, bind, **kw)
        except OSError as e:
            raise Internal(f"{e}") from None


FRONTENDS = ("auto", "native", "python")


def _read(value) -> bytes:
    return value if isinstance(value, bytes) else Path(value).read_bytes()


def serve(data_dir, host: str = "127.0.0.1", port: int = 50051, token: str | None = None,
          tls_cert=None, tls_key=None, workers: int = 8, metrics_port: int | None = None,
          max_message_bytes: int = MAX_MESSAGE_BYTES, limits: Limits = Limits(),
          engine=None, frontend: str = "auto", readonly: bool = False, member=None,
          device: str = "cpu", insecure: bool = False, model_root=None,
          snapshot_root=None) -> Server:
    """Start serving ``data_dir`` (or an already open ``engine``); returns at once.

    ``device``: "cpu" or "cuda" (the engine's placement, ``polyindex.cuda``).
    ``frontend``: "native" (gRPC C++, built by pip or ``make native``), "python" (grpcio) or "auto"
    (native when built). Both serve the same servicer, auth, errors and metrics. ``member``:
    this process is one worker of ``serve --processes N`` (``service.group.Member``): it
    shares the port (SO_REUSEPORT), listens on its private socket too, and is the writer
    (worker 0) or a read-only follower forwarding writes to it. ``insecure``: serve a host
    beyond loopback with no token and no TLS (refused otherwise, ``service.exposure``).
    ``model_root``: folders under it may be named as a new collection's model by clients
    (``service.models``). ``snapshot_root``: where CreateSnapshot writes (and List/Delete
    look); interrupted snapshots older than an hour there are removed. The served collections' models load in a thread; health answers
    NOT_SERVING until they are ready."""
    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgument("TLS needs both a certificate and a key")
    if workers < 1:
        raise InvalidArgument(f"workers must be >= 1, got {workers}")
    if frontend not in FRONTENDS:
        raise InvalidArgument(f"frontend must be one of {', '.join(FRONTENDS)}, got {frontend!r}")
    if frontend == "native" and not native_front.available():
        raise InvalidArgument(f"the native gRPC front end is not available: {native_front.MISSING}")
    front_cls = GrpcioFront if frontend == "python" or not native_front.available() else NativeFront
    tls = None if tls_cert is None else (_read(tls_key), _read(tls_cert))
    warning = check_exposure(host, token=bool(token), tls=tls_cert is not None,
                             insecure=insecure)
    if warning and member is None:  # a group's parent said it once
        print(warning, file=sys.stderr, flush=True)
    if member is None:  # a group's parent checked its port; gRPC's bind would log a dump
        check_free(host, port)
    own_engine = engine is None
    if member is not None:
        readonly = member.role != "writer"  # followers follow the writer's commits and WAL
    if own_engine:
        from polyindex.engine import Engine
        engine = Engine(data_dir, device=device, online=not readonly, readonly=readonly)
    metrics = Metrics(engine, member)
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        served = collection_models(engine)
        loader = ModelLoader(served)
        models = ModelPolicy(served, model_root, loader)
        if snapshot_root is not None and (member is None or member.role == "writer"):
            from polyindex.storage.restore import sweep
            sweep(snapshot_root)
        service = PolyindexService(engine, metrics, limits, member, models,
                                   None if snapshot_root is None else Path(snapshot_root))
        front = front_cls(service, bind, token=token,
                          on_reject=lambda m: metrics.observe(m.rsplit("/", 1)[-1],
                                                              "UNAUTHENTICATED", 0.0),
                          tls=tls, workers=workers, max_message_bytes=max_message_bytes,
                          reuseport=member is not None,
                          private_bind=member.private_bind if member is not None else None)
        bound_metrics = metrics.start_http(metrics_port) if metrics_port is not None else None
    except BaseException:
        if own_engine:
            engine.close()  # nothing will serve it: release its lock, flush its WAL
        raise
    if loader.models:  # health: NOT_SERVING until every model is loaded
        front.set_serving(False)
        loader.start(on_ready=lambda: front.set_serving(True))
    srv = Server(front, engine, metrics, host, tls is not None, bound_metrics)
    srv.member, srv.models_ready, srv.service = member, loader.ready, service
    return srv


def run(data_dir, *, token_file=None, grace: float | None = None, cpus: str | None = None,
        console=None, **kw) -> None:
    """Serve until SIGTERM/SIGINT, then stop gracefully within a bound (``polyindex serve``,
    ``service.shutdown``). ``cpus`` (e.g. ``"1"`` or ``"0-3"``) pins the process before any
    server thread starts. ``console(address, token, latency)``: starts something beside the
    server once it serves (the web console, handed by the CLI) and returns its stop."""
    if cpus is not None:
        pin_process(parse_cpus(cpus))
    token = None
    if token_file is not None:
        token = Path(token_file).read_text().strip()
        if not token:
            raise InvalidArgument(f"token file {token_file} is empty")
    srv = serve(data_dir, token=token, **kw)
    if srv.frontend != "native" and kw.get("frontend", "auto") == "auto":
        print(f"polyindex: serving with grpcio, the native gRPC front end is not available: "
              f"{native_front.MISSING}", file=sys.stderr, flush=True)
    extras = [x for x in (f"{srv.frontend} front end", "tls" if srv.tls else "", "token" if token else "",
                          f"cpus {cpus}" if cpus is not None else "",
                          f"metrics on 127.0.0.1:{srv.metrics_port}" if srv.metrics_port else "") if x]
    print(f"polyindex serving on {srv.address}" + (f" ({', '.join(extras)})" if extras else ""),
          flush=True)
    stop_console = None
    try:
        if console is not None:
            stop_console = console(srv.address, token, srv.metrics.query_latency)
    except BaseException:
        srv.stop(grace)
        raise
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    if stop_console is not None:
        stop_console()
    stop_bounded(srv, grace)
