"""Checks of stored files: sizes and xxh3_64 sums, Arrow IPC validation, and safe names.

A manifest records ``{"size": N, "xxh3": "<16 hex>"}`` for every file it names (manifest
format 2). A file is checked before anything parses a byte of it; a file that passed is
remembered for this process by its identity (device, inode, size, mtime) and expected sum,
so reopening it (the writer, a new snapshot) costs a ``stat``, not a read. Files of format-1
manifests carry no sum: their Arrow IPC files are validated in full instead. Every failure
is ``Corrupt`` naming the file.
"""
from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa
import xxhash

from polyindex.errors import Corrupt

CHUNK = 4 << 20
_HEX = re.compile(r"^[0-9a-f]{16}$")
# Plain file or folder names (no separators, no '..', not hidden), as artifacts and segment
# files are named; the same alphabet as collection names.
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

_MAX_REMEMBERED = 1 << 16
_verified: OrderedDict[tuple, None] = OrderedDict()
_verified_lock = threading.Lock()


def sum_bytes(data: bytes | memoryview) -> dict:
    return {"size": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}


def sum_file(path: Path) -> dict:
    """Size and xxh3_64 of a file, read once in chunks."""
    h = xxhash.xxh3_64()
    size = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return {"size": size, "xxh3": h.hexdigest()}


def is_plain_name(name: object) -> bool:
    return isinstance(name, str) and bool(_PLAIN.match(name)) and ".." not in name


def check_sum_entry(value: object, where: str) -> dict:
    """A manifest's ``{"size", "xxh3"}`` record, validated (Corrupt naming ``where``)."""
    if (not isinstance(value, dict) or set(value) != {"size", "xxh3"}
            or not isinstance(value["size"], int) or isinstance(value["size"], bool)
            or value["size"] < 0 or not isinstance(value["xxh3"], str)
            or not _HEX.match(value["xxh3"])):
        raise Corrupt(f"{where}: malformed file checksum {value!r} (want size and xxh3)")
    return value


def _identity(st: os.stat_result, path: Path, expect: dict) -> tuple:
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, expect["xxh3"])


def remember(path: Path, expect: dict) -> None:
    """Mark a file this process just wrote and summed as verified (no second read)."""
    key = _identity(os.stat(path), path, expect)
    with _verified_lock:
        _verified[key] = None
        while len(_verified) > _MAX_REMEMBERED:
            _verified.popitem(last=False)


def check_file(path: Path, expect: dict, *, cached: bool = True) -> int:
    """Raise Corrupt unless ``path`` has the expected size and xxh3; returns bytes read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise Corrupt(f"{path}: missing (the manifest names it)") from None
    except OSError as e:
        raise Corrupt(f"{path}: cannot stat: {e}") from e
    if st.st_size != expect["size"]:
        raise Corrupt(f"{path}: {st.st_size} bytes, the manifest says {expect['size']} "
                      "(truncated or damaged)")
    key = _identity(st, path, expect)
    if cached:
        with _verified_lock:
            if key in _verified:
                _verified.move_to_end(key)
                return 0
    try:
        got = sum_file(path)
    except OSError as e:
        raise Corrupt(f"{path}: cannot read: {e}") from e
    if got != expect:
        raise Corrupt(f"{path}: checksum mismatch (xxh3 {got['xxh3']}, the manifest says "
                      f"{expect['xxh3']}): the file is damaged")
    if cached:
        remember(path, expect)
    return got["size"]


def validate_arrow(path: Path) -> int:
    """Full validation of an Arrow IPC file without a checksum; returns its row count."""
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        rows = 0
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            batch.validate(full=True)
            rows += batch.num_rows
        return rows
    except FileNotFoundError:
        raise Corrupt(f"{path}: missing") from None
    except (OSError, pa.ArrowException) as e:
        raise Corrupt(f"{path}: not a valid Arrow IPC file: {e}") from e


def check_folder(folder: Path, files: dict[str, dict], what: str) -> None:
    """Every listed file of a folder has its size and sum, and nothing unlisted is there
    (an index kind may open an optional file by name: an unlisted one would go unchecked)."""
    try:
        present = {p.name for p in folder.iterdir()}
    except FileNotFoundError:
        raise Corrupt(f"{folder}: {what} folder is missing (the manifest names it)") from None
    extra = sorted(present - set(files))
    if extra:
        raise Corrupt(f"{folder}: {what} holds files its manifest entry does not list: "
                      f"{', '.join(extra)}")
    for name, expect in files.items():
        check_file(folder / name, expect)


def check_artifacts(folder: Path, manifest) -> None:
    """Every collection-level artifact the manifest names and sums (``artifacts/<kind>/``)."""
    for kind, sums in manifest.artifact_sums.items():
        for name, expect in sums.items():
            check_file(folder / "artifacts" / kind / name, expect)
