"""Segment builds in a child process at a lower CPU priority, so that the queries of this
process keep their latency while an online collection seals and merges.

Why a process: building a segment (analysis, postings, FAISS) holds the GIL for long
stretches. Built in a thread beside queries on two cores, it took query p99 from ~1 ms to
13 ms, and neither a lower thread priority nor one OpenMP thread helped; the same builds in a
child process at nice +10 left query p99 at ~1 ms (bench/README.md, bench_living).

The child (``python -m polyindex.storage.build_worker``: nothing re-imports the caller's
``__main__``) is started on first use, runs one job at a time sent over a pipe (a function of
``polyindex`` by dotted path, its arguments pickled into the pipe; documents travel as
columns, not as objects) and writes only into the folder it is
given; the caller fsyncs, sums, renames and commits as before, so failpoints and
crash-safety are the writer's. A child that dies fails its job (the seal or merge is retried,
a new child started); a child whose parent died exits. ``POLYINDEX_BUILD_WORKER=0`` builds
in the calling thread.
"""
from __future__ import annotations

import atexit
import importlib
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable

from polyindex.config import child_environ, settings

NICE = 10            # below the serving threads; the OS still gives it any idle core
WATCH_S = 0.05       # how often the child checks that its parent is alive
_HEADER = struct.Struct("<Q")
log = logging.getLogger("polyindex.storage")


class WorkerDied(RuntimeError):
    """The build process exited during a job (killed, out of memory); nothing was committed."""


class Stopped(Exception):
    """The caller asked to stop (``stop()`` became true): the child was killed mid-job."""


def enabled() -> bool:
    return settings().build_worker


def _write(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _read_frame(fd: int) -> bytes | None:
    head = _read(fd, _HEADER.size)
    return None if head is None else _read(fd, _HEADER.unpack(head)[0])


def _resolve(target: str) -> Callable:
    module, _, name = target.partition(":")
    if not module.startswith("polyindex."):
        raise ValueError(f"build worker: {target!r} is not a polyindex function")
    return getattr(importlib.import_module(module), name)


class BuildWorker:
    """One child process; ``call`` runs a job in it (one at a time; callers queue)."""

    def __init__(self, purpose: str):
        self.purpose = purpose
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def running(self) -> bool:
        """Whether the child is up (a job sent now pays no process start)."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    def _ensure(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        env = child_environ()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "polyindex.storage.build_worker", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        log.info("build worker (%s) started: pid %d", self.purpose, self._proc.pid)
        return self._proc

    def call(self, target: str, *args, stop: Callable[[], bool] | None = None, **kwargs):
        with self._lock:
            proc = self._ensure()
            reply = None
            try:
                # Pickled straight into the pipe: written frame by frame, each write letting
                # go of the GIL, where one pickle.dumps of a seal's documents held it ~40 ms.
                pickle.Pickler(proc.stdin, protocol=5).dump((target, args, kwargs))
                proc.stdin.flush()
                fd = proc.stdout.fileno()
                while not select.select([fd], [], [], 0.2)[0]:
                    if stop is not None and stop():
                        self._kill()
                        raise Stopped(f"build of {target} stopped")
                reply = _read_frame(fd)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the child is gone: WorkerDied below
            except Stopped:
                raise
            except BaseException:
                self._kill()  # e.g. an argument that does not pickle: the stream is cut short
                raise
            if reply is None:
                code = self._kill()
                raise WorkerDied(f"the build process ({self.purpose}) exited with code {code} "
                                 f"during {target}")
        try:
            status, value = pickle.loads(reply)
        except Exception as e:  # noqa: BLE001 - e.g. an exception class that does not unpickle
            raise RuntimeError(f"build process ({self.purpose}): unreadable reply to {target}: "
                               f"{e}") from e
        if status == "ok":
            return value
        raise value

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        return code

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # end of input: the child exits
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        try:
            proc.stdout.close()
        except OSError:
            pass


_workers: dict[str, BuildWorker] = {}
_workers_lock = threading.Lock()


def worker(purpose: str) -> BuildWorker:
    """This process's worker for ``purpose`` (``seal``, ``merge``: a long merge does not
    hold up a seal)."""
    with _workers_lock:
        w = _workers.get(purpose)
        if w is None:
            w = _workers[purpose] = BuildWorker(purpose)
        return w


def running(purpose: str) -> bool:
    """Whether this process's worker for ``purpose`` is up."""
    with _workers_lock:
        w = _workers.get(purpose)
    return w is not None and w.running()


def run(purpose: str, target: str, *args, stop: Callable[[], bool] | None = None, **kwargs):
    """``target(*args, **kwargs)`` in the worker for ``purpose`` or, when workers are off,
    here."""
    if not enabled():
        if stop is not None and stop():
            raise Stopped(f"build of {target} stopped")
        return _resolve(target)(*args, **kwargs)
    return worker(purpose).call(target, *args, stop=stop, **kwargs)


@atexit.register
def _close_all() -> None:
    with _workers_lock:
        workers = list(_workers.values())
    for w in workers:
        w.close()


def pause(seconds: float) -> int:
    """A job that only waits and answers its pid (tests of stopping and of a parent's death)."""
    time.sleep(seconds)
    return os.getpid()


# -- the child -------------------------------------------------------------------------------
def _watch_parent(parent: int) -> None:
    # The parent's death leaves the pipe open while a job runs: exit at once rather than
    # finish writing into a folder a new writer may reuse.
    while True:
        time.sleep(WATCH_S)
        if os.getppid() != parent:
            os._exit(3)


def main() -> None:
    parent = int(sys.argv[1])
    out = os.dup(1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the reply pipe
    inp = os.fdopen(0, "rb")
    try:
        os.nice(NICE)
    except OSError:
        pass
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    while True:
        try:
            job = pickle.Unpickler(inp).load()
        except EOFError:
            return  # the parent closed the pipe (or died)
        try:
            target, args, kwargs = job
            reply = ("ok", _resolve(target)(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - sent back to the caller, who raises it
            reply = ("err", e)
        try:
            data = pickle.dumps(reply, protocol=5)
        except Exception:  # noqa: BLE001 - an unpicklable result or exception
            err = reply[1] if reply[0] == "err" else None
            text = "".join(traceback.format_exception(err)) if err else "unpicklable result"
            data = pickle.dumps(("err", RuntimeError(f"build worker: {text}")))
        _write(out, data)


if __name__ == "__main__":
    main()
