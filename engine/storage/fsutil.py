"""Durable file operations: the only way polyindex makes something visible on disk.

Each operation names its *point* (``"seal.segment"``, ``"wal.append"``, ...) and calls the
failpoint ``<point>.<op>`` first (``write``, ``fsync``, ``fsync_dir``, ``rename``, ``unlink``,
``mkdir``), so tests can fail or crash every step of every durable path and can check the
order of fsyncs and renames (see ``polyindex.storage.failpoints``).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from polyindex.storage.failpoints import hit


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path, point: str = "fs") -> None:
    hit(f"{point}.fsync_dir", path)
    _fsync(path)


def fsync_file(path: Path, point: str = "fs") -> None:
    hit(f"{point}.fsync", path)
    _fsync(path)


def fsync_tree(folder: Path, point: str = "fs") -> None:
    """fsync every file in a folder, then the folder itself (before it is renamed into place)."""
    for entry in sorted(folder.iterdir()):
        if entry.is_file():
            fsync_file(entry, point)
    fsync_dir(folder, point)


def write_file(path: Path, data: bytes, point: str = "fs") -> None:
    """Create ``path`` with ``data`` and fsync it (not its folder: the caller renames or
    fsyncs the folder once for many files)."""
    hit(f"{point}.write", path)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        hit(f"{point}.fsync", path)
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes, point: str = "fs") -> None:
    """Write to a temporary file, fsync, rename over ``path``, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write_file(tmp, data, point)
        rename(tmp, path, point)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent, point)


def write_json_atomic(path: Path, obj, point: str = "fs") -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode(), point)


def rename(src: Path, dst: Path, point: str = "fs") -> None:
    hit(f"{point}.rename", dst)
    os.replace(src, dst)


def unlink(path: Path, point: str = "fs") -> None:
    hit(f"{point}.unlink", path)
    Path(path).unlink(missing_ok=True)


def rmtree(path: Path, point: str = "fs") -> None:
    hit(f"{point}.unlink", path)
    shutil.rmtree(path, ignore_errors=True)


def mkdir(path: Path, point: str = "fs", parents: bool = False) -> None:
    hit(f"{point}.mkdir", path)
    Path(path).mkdir(parents=parents, exist_ok=True)
