"""Named failpoints in the storage and WAL code, for fault injection (off in production).

Every write, fsync, rename and unlink on a durable path goes through ``polyindex.storage.fsutil``,
which calls ``hit("<path>.<op>")`` first, e.g. ``seal.manifest.rename`` or
``wal.append.fsync``. With nothing armed and no log, ``hit`` is one test of a module global.

Arm points from a test with ``arm(name, action, nth)`` / ``armed(...)``, or for a whole
process from the environment: ``POLYINDEX_FAILPOINTS="wal.append.fsync=enospc@2;seal.*=crash"``
(``@N``: fire on the N-th hit of the point, default the first; a trailing ``*`` matches a
prefix). Actions: ``error`` (OSError EIO), ``enospc``, ``edquot`` (the disk-full errors),
``crash`` (SIGKILL of this process at once: a kill -9 at exactly that step, nothing flushed)
and ``hang`` (the step never returns: a seal stuck in work that cannot be interrupted), and
``pause`` (the step takes ``PAUSE_S`` seconds, then goes on: a slow disk; from the N-th hit
on, every hit).

``record()`` (or ``POLYINDEX_FAILPOINT_LOG=FILE``) keeps every hit in order as ``(point, path)``,
which is how a test checks that files and their folders are fsynced before a manifest names
them (power loss is not simulated by kill -9; the order of operations is what can be checked).
"""
from __future__ import annotations

import errno
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from polyindex.config import settings

ACTIONS = ("error", "enospc", "edquot", "crash", "hang", "pause")
PAUSE_S = 5.0  # "pause": the step takes this long, then goes on (a slow disk)
_ERRNO = {"error": errno.EIO, "enospc": errno.ENOSPC, "edquot": errno.EDQUOT}


@dataclass
class _Armed:
    action: str
    nth: int = 1
    seen: int = 0
    fired: int = 0


_lock = threading.Lock()
_armed: dict[str, _Armed] = {}
_counts: dict[str, int] = {}
_log: list[tuple[str, str]] | None = None
_log_file = None
ACTIVE = False  # anything armed or recorded: the only thing ``hit`` reads when off


def _refresh() -> None:
    global ACTIVE
    ACTIVE = bool(_armed) or _log is not None or _log_file is not None


def _match(name: str) -> _Armed | None:
    got = _armed.get(name)
    if got is not None:
        return got
    for key, value in _armed.items():
        if key.endswith("*") and name.startswith(key[:-1]):
            return value
    return None


def hit(name: str, path: object = "") -> None:
    """Called before the operation ``name`` on ``path``: may raise OSError or kill the process."""
    if not ACTIVE:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _log is not None:
            _log.append((name, str(path)))
        if _log_file is not None:
            _log_file.write(f"{name}\t{path}\n")
            _log_file.flush()
        point = _match(name)
        if point is None:
            return
        point.seen += 1
        if point.seen != point.nth and not (point.action == "pause" and point.seen > point.nth):
            return
        point.fired += 1
        action = point.action
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        threading.Event().wait()
    if action == "pause":
        time.sleep(PAUSE_S)
        return
    code = _ERRNO[action]
    raise OSError(code, f"{os.strerror(code)} (failpoint {name})", str(path))


def arm(name: str, action: str = "error", nth: int = 1) -> None:
    if action not in ACTIONS:
        raise ValueError(f"failpoint action must be one of {ACTIONS}, got {action!r}")
    with _lock:
        _armed[name] = _Armed(action, nth)
        _refresh()


def disarm(name: str | None = None) -> None:
    """Disarm one point, or every point (and stop recording) with no name."""
    global _log
    with _lock:
        if name is None:
            _armed.clear()
            _log = None
        else:
            _armed.pop(name, None)
        _refresh()


def fired(name: str) -> int:
    got = _armed.get(name)
    return got.fired if got else 0


@contextmanager
def armed(name: str, action: str = "error", nth: int = 1):
    arm(name, action, nth)
    try:
        yield
    finally:
        disarm(name)


@contextmanager
def record():
    """Log every hit in order while the block runs; yields the list of (point, path)."""
    global _log
    with _lock:
        _log = []
        _refresh()
        log = _log
    try:
        yield log
    finally:
        with _lock:
            _log = None
            _refresh()


def counts() -> dict[str, int]:
    """How often each point was hit since the process started (points seen while active)."""
    with _lock:
        return dict(_counts)


def _from_environment() -> None:
    global _log_file
    spec = settings().failpoints
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, rest = part.partition("=")
        action, _, nth = (rest or "error").partition("@")
        arm(name.strip(), action.strip(), int(nth) if nth else 1)
    path = settings().failpoint_log
    if path:
        _log_file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        _refresh()


_from_environment()
