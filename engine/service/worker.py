"""One worker of ``polyindex serve --processes N``: ``python -m polyindex.service.worker CONFIG``.

Started by ``service.supervisor`` as a fresh interpreter (spawn, not fork: the gRPC Python
multiprocessing rule is that no gRPC server, channel or thread pool exists when a process
forks, and a fresh interpreter has none). CONFIG is JSON: the serve options plus ``worker``
(0 is the writer), ``processes``, ``runtime`` (the group's private folder), ``parent`` (its
pid) and ``restarts``. The worker serves until SIGTERM/SIGINT, or until the parent dies
(``PR_SET_PDEATHSIG`` sends it SIGTERM; the end of its stdin pipe says the same), then
drains and closes (the writer seals). Its first stdout line is JSON for the parent:
``{"ready": true, "pid", "metrics_port", "frontend"}`` or ``{"error": ...}``.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
LOCK_WAIT_S = 30.0  # a restarted writer waits this long for the dead one's lock to go


def _die_with_parent(parent: int, done: threading.Event) -> None:
    """SIGTERM when the parent dies (kill -9 included), so no orphan keeps serving."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the stdin pipe below still tells
        pass
    if os.getppid() != parent:  # it died before prctl took effect
        done.set()

    def watch_stdin():
        try:  # the raw descriptor: a buffered reader would block the interpreter's exit
            while os.read(0, 4096):
                pass  # EOF: the parent closed its end, or died
        except OSError:
            pass
        done.set()
    threading.Thread(target=watch_stdin, name="parent-watch", daemon=True).start()


def _serve(cfg: dict):
    from polyindex.errors import FailedPrecondition
    from polyindex.service.group import Member, socket_path
    from polyindex.service.server import serve
    member = Member(cfg["worker"], cfg["processes"], Path(cfg["runtime"]), cfg["restarts"],
                    readonly=cfg["readonly"])
    # Temporary files (a follower's buffer segments) in the group's folder, which the parent
    # removes at the end even when this worker was killed; a predecessor's are removed now
    scratch = member.runtime / f"tmp-{member.worker}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    tempfile.tempdir = str(scratch)
    socket_path(member.runtime, member.worker).unlink(missing_ok=True)  # a dead predecessor's
    token = None
    if cfg.get("token_file"):
        token = Path(cfg["token_file"]).read_text().strip()
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return serve(cfg["data"], host=cfg["host"], port=cfg["port"], token=token,
                         tls_cert=cfg.get("tls_cert"), tls_key=cfg.get("tls_key"),
                         workers=cfg["workers"], metrics_port=0, frontend=cfg["frontend"],
                         member=member, insecure=cfg.get("insecure", False),
                         model_root=cfg.get("model_root"),
                         snapshot_root=cfg.get("snapshot_root"))
        except FailedPrecondition:
            # A restarted writer's predecessor may still be releasing the directory's lock;
            # at the group's start, a lock held by another program fails at once
            if member.role != "writer" or not member.restarts or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    _die_with_parent(cfg["parent"], done)
    if cfg.get("cpus"):
        from polyindex.service.affinity import parse_cpus, pin_process
        pin_process(parse_cpus(cfg["cpus"]))
    try:
        srv = _serve(cfg)
    except Exception as e:  # noqa: BLE001 - told to the parent, which reports it
        print(json.dumps({"error": f"{getattr(e, 'status', type(e).__name__)}: {e}"}), flush=True)
        return 1
    print(json.dumps({"ready": True, "pid": os.getpid(), "metrics_port": srv.metrics_port,
                      "frontend": srv.frontend}), flush=True)
    while not done.wait(1.0):
        pass
    from polyindex.service.shutdown import stop_bounded
    stop_bounded(srv, cfg["grace"])
    if os.getppid() != cfg["parent"]:  # orphaned: nobody else will clean the group's folder
        runtime = Path(cfg["runtime"])
        shutil.rmtree(runtime / f"tmp-{cfg['worker']}", ignore_errors=True)
        (runtime / f"worker-{cfg['worker']}.sock").unlink(missing_ok=True)
        try:
            runtime.rmdir()  # the last worker out
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
