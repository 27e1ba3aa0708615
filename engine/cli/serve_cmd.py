"""``polyindex serve``: the gRPC service (one process, a process group, or Ray shards) and,
beside it, the web console."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from polyindex.cli.options import DataOpt, DeviceOpt
from polyindex.errors import InvalidArgument


def serve(data: Path = DataOpt,
          host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
          port: int = typer.Option(50051, "--port", help="Port; 0 picks a free one (the bound address is printed)."),
          token_file: Optional[Path] = typer.Option(None, "--token-file", help="File holding the bearer token every call must send."),
          tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="PEM certificate (with --tls-key)."),
          tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="PEM private key."),
          workers: int = typer.Option(8, "--workers", help="Threads serving calls concurrently."),
          metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus /metrics on 127.0.0.1:PORT."),
          cpus: Optional[str] = typer.Option(None, "--cpus", help="Pin the server to these CPUs (e.g. 1 or 0-3): fewer cross-core wake-ups per call, lower latency, less parallelism."),
          frontend: str = typer.Option("auto", "--frontend", help="native (gRPC C++, built at install when gRPC C++ is found), python (grpcio) or auto (native when built; says so when it falls back)."),
          readonly: bool = typer.Option(False, "--readonly", help="Serve queries only, beside the directory's writer: no lock, writes refused (FAILED_PRECONDITION), new commits and acknowledged writes followed."),
          processes: int = typer.Option(1, "--processes", min=1, help="Server processes behind the one port (SO_REUSEPORT): one writer, the others read-only followers forwarding writes to it. Past the GIL: one process per core."),
          shards: Optional[int] = typer.Option(None, "--shards", min=1, help="Serve DATA as a sharded directory on Ray (ids hashed to S shards, each its own data directory served by Ray actors); S is fixed when the directory is created. Needs the ray extra."),
          replicas: int = typer.Option(1, "--replicas", min=1, help="With --shards: Ray actors per shard (one writer, the others read-only followers of its WAL)."),
          ray_address: Optional[str] = typer.Option(None, "--ray-address", help="With --shards: join the Ray cluster at ADDR (default: start a local Ray bound to 127.0.0.1)."),
          insecure: bool = typer.Option(False, "--insecure", help="Serve a --host beyond loopback in plaintext with no token (refused without this flag): anyone who reaches it can read, write and drop every collection."),
          model_root: Optional[Path] = typer.Option(None, "--model-root", metavar="DIR", help="Clients creating a collection may name a model folder under DIR (besides the shipped model and those of the served collections)."),
          console_port: Optional[int] = typer.Option(None, "--console-port", metavar="PORT", help="Serve the web console (collections, search with explain, compare, evaluation charts; read-only) on PORT; 0 picks a free one. It needs the same token as the gRPC port."),
          console_host: str = typer.Option("127.0.0.1", "--console-host", help="Address the console binds (loopback by default; beyond it, the same rule as --host: a token, or --insecure)."),
          console_root: Optional[Path] = typer.Option(None, "--console-root", metavar="DIR", help="The console's evaluation reads queries and qrels files under DIR only (default: --data)."),
          snapshot_root: Optional[Path] = typer.Option(None, "--snapshot-root", metavar="DIR", help="Clients may write, list and delete snapshots under DIR (`polyindex snapshot create --server`)."),
          device: str = DeviceOpt):
    """Serve the collections over gRPC.

    Runs until SIGTERM/SIGINT, then drains calls and flushes buffered writes."""
    from polyindex.service.exposure import check_exposure
    # before anything binds a port or starts Ray
    warning = check_exposure(host, token=token_file is not None, tls=tls_cert is not None,
                             insecure=insecure)
    console = None
    if console_port is not None:
        console = _console(data, console_host, console_port, console_root, tls_cert,
                           token_file is not None, insecure, warned=warning is not None)
    if model_root is not None and not model_root.is_dir():
        raise InvalidArgument(f"--model-root {model_root} is not a directory")
    if snapshot_root is not None and not snapshot_root.is_dir():
        raise InvalidArgument(f"--snapshot-root {snapshot_root} is not a directory")
    from polyindex.cuda.device import check_device
    check_device(device)
    kw = dict(host=host, port=port, token_file=token_file, tls_cert=tls_cert, tls_key=tls_key,
              workers=workers, metrics_port=metrics_port, cpus=cpus, frontend=frontend,
              readonly=readonly, insecure=insecure, model_root=model_root, console=console,
              snapshot_root=snapshot_root)
    if shards is not None or (data / "shards.json").is_file():
        if device != "cpu":  # the shard actors open their engines on the CPU
            raise InvalidArgument("--device cuda does not go with --shards")
        if processes > 1 or readonly:
            raise InvalidArgument("--shards serves through Ray actors: --processes and "
                                  "--readonly do not apply (use --replicas)")
        from polyindex.distributed.serving import ShardedEngine
        from polyindex.service.server import run
        run(data, engine=ShardedEngine(data, shards=shards, replicas=replicas,
                                       address=ray_address), **kw)
        return
    if processes > 1:
        if device != "cpu":  # every process would hold its own copy of the indexes on the GPU
            raise InvalidArgument("--device cuda serves from one process: drop --processes")
        from polyindex.service.supervisor import run_group
        run_group(data, processes, **kw)
        return
    from polyindex.service.server import run
    run(data, device=device, **kw)


def _console(data: Path, host: str, port: int, root: Optional[Path], tls_cert, token: bool,
             insecure: bool, warned: bool):
    """Check the console's address as the gRPC one is (before anything binds) and return
    what starts it beside the server (``console.serve``)."""
    from polyindex.service.exposure import check_exposure, is_loopback
    from polyindex.service.ports import check_free
    warning = check_exposure(host, token=token, tls=False, insecure=insecure)
    if warning and not warned:
        print(f"{warning} (the console, --console-host)", file=sys.stderr, flush=True)
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"--console-port must be in 0..65535, got {port}")
    check_free(host, port)
    root = root if root is not None else data
    if not Path(root).is_dir():
        raise InvalidArgument(f"--console-root {root} is not a directory")
    loopback = is_loopback(host)

    def start(address: str, token_value, latency):
        from polyindex.console.serve import start_console
        return start_console(address, token_value, host=host, port=port, root=root,
                             loopback=loopback, tls_cert=tls_cert, latency=latency).stop
    return start
