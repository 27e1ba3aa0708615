"""``polyindex serve --processes N``: N server processes behind one port.

The parent starts no gRPC at all (the gRPC Python multiprocessing rule: nothing of gRPC may
exist in a process that forks); it checks the port, spawns the workers as fresh interpreters
(``service.worker``), watches them and stops them:

- **The port**: a bind first without SO_REUSEPORT (``service.ports``), so a port that any
  other program holds (even with SO_REUSEPORT) fails with a clear error instead of being shared silently; then the parent
  keeps a bound, never listening SO_REUSEPORT socket on it for its lifetime (it takes no
  connections, and keeps programs without SO_REUSEPORT off the port while workers restart).
  The workers listen on it with SO_REUSEPORT: the kernel spreads new connections over them.
- **Roles**: worker 0 is the writer (the directory's lock, the WAL, seals, merges), started
  first; the others are read-only followers (``online.follow``) forwarding writes to it over
  its private unix socket in the group's runtime folder (``service.group``).
- **Failures**: a worker that dies is reported on stderr and started again (after a pause
  that grows while it keeps dying young); a restarted writer waits for the dead one's lock.
  Workers die with the parent (``PR_SET_PDEATHSIG`` and their stdin pipe).
- **SIGTERM/SIGINT**: followers are stopped first (they drain; writes they forward still
  reach the writer), then the writer (it drains, seals and closes); a worker that does not
  stop within its grace plus ``STOP_MARGIN_S`` is killed.
- **Metrics**: ``--metrics-port`` is served by the parent: every worker's series labelled
  with its worker, role and pid, plus sums over the workers (``service.group_metrics``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from polyindex.config import settings
from polyindex.errors import FailedPrecondition, Internal, InvalidArgument
from polyindex.service.exposure import check_exposure
from polyindex.service.ports import bind_probe

READY_WAIT_S = 300.0  # a worker loads its collections before it is ready
STOP_MARGIN_S = 30.0   # beyond the grace: the writer's last seal
YOUNG_S = 10.0         # a worker that dies younger than this is restarted after a pause
POLL_S = 0.2


def reserve_port(host: str, port: int) -> socket.socket:
    """Check that no other program holds ``host:port`` and keep it for the group."""
    # No SO_REUSEPORT: fails if anyone listens on the port at all; SO_REUSEADDR: a previous
    # group's connections in TIME_WAIT do not (a restart right after a clean stop)
    probe = bind_probe(host, port)
    family, port = probe.family, probe.getsockname()[1]
    probe.close()
    keep = socket.socket(family, socket.SOCK_STREAM)
    keep.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        keep.bind((host, port))
    except OSError as e:
        keep.close()
        raise FailedPrecondition(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return keep


class Worker:
    """One worker process and what the parent knows of it."""

    def __init__(self, index: int, cfg: dict):
        self.index, self.cfg = index, cfg
        self.role = ("readonly" if cfg["readonly"] else "writer" if index == 0 else "follower")
        self.proc: subprocess.Popen | None = None
        self.restarts = -1
        self.started = 0.0
        self.info: dict = {}
        self.answered = threading.Event()
        self.last_exit: str | None = None

    def start(self) -> None:
        self.restarts += 1
        cfg = {**self.cfg, "worker": self.index, "restarts": self.restarts,
               "parent": os.getpid()}
        self.info, self.answered = {}, threading.Event()
        # stdin: a pipe the worker reads to its end (it ends when this process dies);
        # a new session: a terminal's Ctrl-C reaches the parent, which stops workers in order
        self.proc = subprocess.Popen([sys.executable, "-m", "polyindex.service.worker",
                                      json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.started = time.monotonic()
        threading.Thread(target=self._read, args=(self.proc, self.info, self.answered),
                         name=f"worker-{self.index}-out", daemon=True).start()

    @staticmethod
    def _read(proc, info: dict, answered: threading.Event) -> None:
        first = proc.stdout.readline()
        try:
            info.update(json.loads(first) if first.strip() else {"error": "exited at start"})
        except ValueError:
            info["error"] = f"unexpected output: {first.strip()[:200]}"
        answered.set()
        for line in proc.stdout:  # anything else it prints goes to ours
            sys.stdout.write(line)
            sys.stdout.flush()

    def wait_ready(self, timeout: float) -> None:
        if not self.answered.wait(timeout):
            raise Internal(f"worker {self.index} ({self.role}) was not ready after {timeout:.0f} s")
        if "error" in self.info:
            raise Internal(f"worker {self.index} ({self.role}) did not start: {self.info['error']}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_text(self, code: int) -> str:
        return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"

    def stop(self, timeout: float) -> int | None:
        """SIGTERM, wait, then SIGKILL; the exit code (None if it had to be killed)."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        if proc.stdin:
            proc.stdin.close()
        return code


class Group:
    def __init__(self, data, processes: int, *, host: str, port: int, token_file, tls_cert,
                 tls_key, workers: int, frontend: str, readonly: bool, cpus: str | None,
                 grace: float, insecure: bool = False, model_root=None, snapshot_root=None):
        self.host, self.grace = host, grace
        self._keep = reserve_port(host, port)
        self.port = self._keep.getsockname()[1]
        self.runtime = Path(tempfile.mkdtemp(prefix="polyindex-serve-"))  # 0700
        cfg = {"data": str(data), "host": host, "port": self.port, "processes": processes,
               "runtime": str(self.runtime), "token_file": str(token_file) if token_file else None,
               "tls_cert": str(tls_cert) if tls_cert else None,
               "tls_key": str(tls_key) if tls_key else None, "workers": workers,
               "frontend": frontend, "readonly": readonly, "cpus": cpus, "grace": grace,
               "insecure": insecure, "model_root": str(model_root) if model_root else None,
               "snapshot_root": str(snapshot_root) if snapshot_root else None}
        self.workers = [Worker(i, cfg) for i in range(processes)]
        self.metrics_port: int | None = None
        self._http = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> None:
        """The writer first (it may create the directory and replays its WAL), then the
        followers together."""
        try:
            writer, *followers = self.workers
            writer.start()
            writer.wait_ready(READY_WAIT_S)
            for w in followers:
                w.start()
            for w in followers:
                w.wait_ready(READY_WAIT_S)
        except BaseException:
            self.stop()
            raise

    def serve_metrics(self, port: int) -> int:
        from prometheus_client import CollectorRegistry, start_http_server

        from polyindex.service.group_metrics import WorkersCollector
        registry = CollectorRegistry()
        registry.register(WorkersCollector(self))
        self._http, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
        self.metrics_port = self._http.server_port
        return self.metrics_port

    def watch(self, done: threading.Event) -> None:
        """Restart workers that die, until ``done``."""
        due: dict[int, float] = {}  # worker -> when to start it again
        while not done.wait(POLL_S):
            now = time.monotonic()
            for w in self.workers:
                code = w.proc.poll() if w.proc is not None else None
                if code is not None and w.index not in due:
                    young = now - w.started < YOUNG_S
                    pause = min(10.0, 0.5 * 2 ** min(w.restarts, 5)) if young else 0.0
                    w.last_exit = w.exit_text(code)
                    print(f"polyindex: worker {w.index} ({w.role}, pid {w.pid}) {w.last_exit}; "
                          f"starting it again in {pause:.1f} s", file=sys.stderr, flush=True)
                    if w.proc.stdin:
                        w.proc.stdin.close()
                    due[w.index] = now + pause
                if w.index in due and now >= due[w.index]:
                    del due[w.index]
                    w.start()
                    threading.Thread(target=self._report_ready, args=(w,), daemon=True).start()

    @staticmethod
    def _report_ready(w: Worker) -> None:
        if w.answered.wait(READY_WAIT_S) and "error" not in w.info:
            print(f"polyindex: worker {w.index} ({w.role}) serving again as pid {w.pid} "
                  f"(restart {w.restarts})", file=sys.stderr, flush=True)
        elif w.info.get("error"):
            print(f"polyindex: worker {w.index} ({w.role}) did not start: {w.info['error']}",
                  file=sys.stderr, flush=True)

    def stop(self) -> bool:
        """Followers first, then the writer; True when every worker stopped cleanly."""
        ok = True
        followers = [w for w in self.workers if w.index != 0]
        for w in followers:  # SIGTERM to all of them first: they drain together
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in followers + self.workers[:1]:
            ok = w.stop(self.grace + STOP_MARGIN_S) == 0 and ok
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self._keep.close()
        shutil.rmtree(self.runtime, ignore_errors=True)
        return ok


def run_group(data, processes: int, *, host: str = "127.0.0.1", port: int = 50051,
              token_file=None, tls_cert=None, tls_key=None, workers: int = 8,
              metrics_port: int | None = None, frontend: str = "auto", readonly: bool = False,
              cpus: str | None = None, grace: float | None = None, insecure: bool = False,
              model_root=None, console=None, snapshot_root=None) -> None:
    """Serve with ``processes`` workers until SIGTERM/SIGINT (``polyindex serve``);
    ``console(address, token, latency)``: as ``server.run``'s, started in this parent
    (no latency here: each worker keeps its own histogram). ``grace``: each worker's, by
    default ``POLYINDEX_SHUTDOWN_GRACE_S`` as for one process."""
    if grace is None:
        grace = settings().shutdown_grace_s
    if processes < 2:
        raise InvalidArgument(f"a process group needs 2 or more processes, got {processes}")
    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgument("TLS needs both a certificate and a key")
    warning = check_exposure(host, token=token_file is not None, tls=tls_cert is not None,
                             insecure=insecure)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if not readonly:
        Path(data).mkdir(parents=True, exist_ok=True)  # followers never create it
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    group = Group(data, processes, host=host, port=port, token_file=token_file,
                  tls_cert=tls_cert, tls_key=tls_key, workers=workers, frontend=frontend,
                  readonly=readonly, cpus=cpus, grace=grace, insecure=insecure,
                  model_root=model_root, snapshot_root=snapshot_root)
    group.start()
    if metrics_port is not None:
        group.serve_metrics(metrics_port)
    fe = group.workers[0].info.get("frontend", "?")
    roles = ", ".join(f"{w.role} pid {w.pid}" for w in group.workers)
    extras = [f"{processes} processes: {roles}", f"{fe} front end",
              "tls" if tls_cert else "", "token" if token_file else "",
              f"metrics on 127.0.0.1:{group.metrics_port}" if group.metrics_port else ""]
    print(f"polyindex serving on {group.address} ({', '.join(x for x in extras if x)})",
          flush=True)
    stop_console = None
    try:
        if console is not None:
            token = Path(token_file).read_text().strip() if token_file else None
            stop_console = console(group.address, token, None)
        group.watch(done)
    finally:
        if stop_console is not None:
            stop_console()
        ok = group.stop()
    if not ok:
        sys.exit(1)
