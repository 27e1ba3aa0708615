"""The write-ahead log of online writes: numbered, checksummed records, fsynced before ack.

Files ``wal/wal-NNNNNNNN.log`` hold frames ``[magic u16][length u32][seq u64][xxh3 u64][payload]``
(payload: UTF-8 JSON; the checksum covers seq and payload). ``seq`` is the operation number:
one per record, strictly increasing across files. The manifest records ``wal_through``, the
highest seq its segments contain; replay skips records at or below it, and a file is deleted
only when every record in it is covered (``drop_through``).

Recovery tells a torn tail from corruption. Only an incomplete or unreadable *final* frame of
the newest file, with no valid frame anywhere after it, is a torn tail: a crash mid-append,
never acknowledged. Its bytes are copied to ``wal/torn/`` (evidence) before the file is cut
back to the last whole record. Anything else - a bad frame followed by a valid one, damage in
an older file, a sequence number out of order - is ``Corrupt`` (DATA_LOSS) naming the file and
byte offset, and nothing is truncated or rewritten.

Frames are written with ``os.write`` on an unbuffered ``O_APPEND`` descriptor: a failed write
leaves no bytes in a user-space buffer that a later flush, seek or close would write again
(after the cut below, and out of sequence). An append that fails (ENOSPC, EIO) cuts the file
back to where it began and fsyncs; if even that fails, the log refuses writes with
RESOURCE_EXHAUSTED and tries the cut again on every later write, so freeing space ends it
without a restart.
"""
from __future__ import annotations

import errno
import json
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import xxhash

from polyindex.errors import (Corrupt, ResourceExhausted, StorageFailed, disk_full,
                              is_disk_full)
from polyindex.storage import fsutil
from polyindex.storage.failpoints import hit

MAGIC = 0x5058  # "XP": frames with a sequence number and an xxh3 checksum
HEADER = struct.Struct("<HIQQ")
OLD_MAGIC = 0x5057  # format 1: [magic u16][length u32][crc32 u32], no sequence number
OLD_HEADER = struct.Struct("<HII")
MAX_RECORD = 1 << 30


def file_name(number: int) -> str:
    return f"wal-{number:08d}.log"


def _checksum(seq: int, payload: bytes) -> int:
    h = xxhash.xxh3_64(seq.to_bytes(8, "little"))
    h.update(payload)
    return h.intdigest()


def disk_error(e: OSError, what: str) -> Exception:
    """ENOSPC/EDQUOT as RESOURCE_EXHAUSTED, other I/O errors as UNAVAILABLE, with a message."""
    if is_disk_full(e):
        return disk_full(e, what, "nothing of this write was kept", path=False)
    reason = os.strerror(e.errno) if e.errno else str(e)
    where = f" ({e.filename})" if e.filename else ""
    out = StorageFailed(e.errno, f"{what} failed: {reason}{where}; nothing of this write was "
                        "kept, it may be retried")
    out.filename = e.filename
    return out


def file_numbers(folder: Path) -> list[int]:
    """The numbers of the log files in ``folder``, ascending."""
    out = []
    for p in folder.glob("wal-*.log"):
        try:
            out.append(int(p.stem.split("-")[1]))
        except ValueError:
            continue
    return sorted(out)


def frame_at(data: bytes, pos: int, prev: int) -> tuple[int, int, bytes] | str:
    """(end, seq, payload) of a valid frame at ``pos``, or why there is none."""
    if len(data) - pos < 2:
        return "truncated record header"
    magic = int.from_bytes(data[pos:pos + 2], "little")
    if magic == MAGIC:
        if len(data) - pos < HEADER.size:
            return "truncated record header"
        _, length, seq, digest = HEADER.unpack_from(data, pos)
        start, end = pos + HEADER.size, pos + HEADER.size + length
        if length > MAX_RECORD or end > len(data):
            return "truncated record"
        if _checksum(seq, data[start:end]) != digest:
            return "checksum mismatch"
        return end, seq, data[start:end]
    if magic == OLD_MAGIC:
        import zlib
        if len(data) - pos < OLD_HEADER.size:
            return "truncated record header"
        _, length, crc = OLD_HEADER.unpack_from(data, pos)
        start, end = pos + OLD_HEADER.size, pos + OLD_HEADER.size + length
        if end > len(data):
            return "truncated record"
        if zlib.crc32(data[start:end]) != crc:
            return "checksum mismatch"
        return end, prev + 1, data[start:end]  # format 1 numbered by position
    return "bad record marker"


def valid_after(data: bytes, pos: int) -> int | None:
    """Offset of a valid frame after ``pos`` (a sign of corruption, not a torn tail)."""
    for magic in (MAGIC, OLD_MAGIC):
        marker = magic.to_bytes(2, "little")
        q = data.find(marker, pos + 1)
        while q != -1:
            if not isinstance(frame_at(data, q, 0), str):
                return q
            q = data.find(marker, q + 1)
    return None


@dataclass
class Scanned:
    """What one log file holds (``scan``)."""

    records: list[tuple[int, dict]]  # (seq, record) of the records above ``after``
    last_seq: int                    # the highest seq so far, this file included
    last_in_file: int                # the last seq in this file (0: no record)
    torn_at: int | None              # offset of a torn tail (the newest file only)


def scan(path: Path, data: bytes, newest: bool, last_seq: int, after: int) -> Scanned:
    """Check every frame of one log file, writing nothing (recovery and ``polyindex verify``
    share it). ``last_seq``: the highest seq of the files before; ``after``: the manifest's
    ``wal_through``. An invalid frame with no valid one after it, in the newest file, is a
    torn tail (its offset is returned); anything else wrong is ``Corrupt`` naming the file
    and byte offset."""
    pos, last, records = 0, 0, []
    while pos < len(data):
        got = frame_at(data, pos, last_seq)
        if isinstance(got, str):
            later = valid_after(data, pos)
            if not newest or later is not None:
                where = (f"; a valid record follows at byte {later}" if later is not None
                         else " (not the newest log file)")
                raise Corrupt(f"{path}: {got} at byte {pos} of {len(data)}{where}")
            return Scanned(records, last_seq, last, pos)
        end, seq, payload = got
        if seq <= last_seq and seq > after:
            raise Corrupt(f"{path}: record at byte {pos} has sequence number {seq}, "
                          f"not above the previous {last_seq}")
        try:
            record = json.loads(payload)
        except ValueError as e:
            raise Corrupt(f"{path}: record at byte {pos} passed its checksum but is not "
                          f"JSON ({e})") from e
        if seq > after:
            records.append((seq, record))
        last_seq = max(last_seq, seq)
        last = seq
        pos = end
    return Scanned(records, last_seq, last, None)


class WriteAheadLog:
    def __init__(self, folder: Path, after: int = 0):
        """Open (and check) the log; ``after``: the manifest's ``wal_through``."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.after = after
        self._lock = threading.Lock()
        # why the log refuses writes: a failed append's bytes are still in the file
        self._partial: str | None = None
        self._last_in: dict[int, int] = {}  # file number -> last seq in it (0: no record)
        self._records: list[tuple[int, dict]] = []
        self.last_seq = after
        numbers = self.numbers()
        for n in numbers:
            self._scan(n, newest=(n == numbers[-1]))
        self.number = numbers[-1] if numbers else 1
        self._last_in.setdefault(self.number, 0)
        self._fd, self._end = _open_log(folder / file_name(self.number))
        if not numbers:
            fsutil.fsync_dir(folder, "wal.create")

    def numbers(self) -> list[int]:
        return file_numbers(self.folder)

    # -- reading -----------------------------------------------------------------------------
    def replay(self) -> Iterator[tuple[int, dict]]:
        """(seq, record) of every record above ``after``, in order (read once, at open)."""
        records, self._records = self._records, []
        yield from records

    def _scan(self, number: int, newest: bool) -> None:
        path = self.folder / file_name(number)
        data = path.read_bytes()
        got = scan(path, data, newest, self.last_seq, self.after)
        self._records.extend(got.records)
        self.last_seq = got.last_seq
        self._last_in[number] = got.last_in_file
        if got.torn_at is not None:
            self._cut_torn_tail(path, data, got.torn_at)

    def _cut_torn_tail(self, path: Path, data: bytes, pos: int) -> None:
        """A crash mid-append left an unacknowledged partial frame: keep its bytes as
        evidence in ``torn/``, then cut the file back to its last whole record."""
        torn = self.folder / "torn"
        torn.mkdir(exist_ok=True)
        fsutil.write_file(torn / f"{path.name}.at{pos}", data[pos:], "wal.recover")
        fsutil.fsync_dir(torn, "wal.recover")
        hit("wal.recover.truncate", path)
        with open(path, "r+b") as f:
            f.truncate(pos)
            os.fsync(f.fileno())

    # -- writing -----------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The file being appended to."""
        return self.folder / file_name(self.number)

    def append(self, record: dict) -> int:
        """Append one record and fsync it; returns its sequence number. When this returns the
        write is durable; when it raises, nothing of it is left in the log (or, while the
        cut itself fails, the log refuses every write until a later one manages it)."""
        payload = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
        with self._lock:
            if self._partial is not None:
                try:
                    self._cut()
                except OSError as e:
                    raise ResourceExhausted(
                        f"write-ahead log {self.path}: writes are refused until {self._partial}; "
                        f"tried again now: {os.strerror(e.errno) if e.errno else e} (each "
                        f"write tries again: free disk space)") from e
            seq = self.last_seq + 1
            frame = HEADER.pack(MAGIC, len(payload), seq, _checksum(seq, payload)) + payload
            try:
                hit("wal.append.write", self.path)
                _write_all(self._fd, frame)
                hit("wal.append.fsync", self.path)
                os.fsync(self._fd)
            except OSError as e:
                self._undo(e)
                raise disk_error(e, "write-ahead log append") from e
            self._end += len(frame)
            self.last_seq = seq
            self._last_in[self.number] = seq
            return seq

    def _undo(self, cause: OSError) -> None:
        """Cut a failed append's bytes off; if that fails too, remember it (writes are
        refused and each one retries the cut)."""
        self._partial = (f"the partial record of a failed append ({_reason(cause)}) at byte "
                         f"{self._end} is removed")
        try:
            self._cut()
        except OSError:  # _partial stays set: the next append (or rotate, or close) retries
            self._spoil()

    def _spoil(self) -> None:
        """While the cut fails: zero the failed frame's marker (best effort), so that a whole
        frame whose fsync failed is read by neither a follower nor a recovery as a write;
        a recovery cuts it as a torn tail (its bytes kept in ``torn/``)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)  # no O_APPEND: pwrite in place
            try:
                if os.fstat(fd).st_size >= self._end + 2:
                    os.pwrite(fd, b"\0\0", self._end)
            finally:
                os.close(fd)
        except OSError:
            pass

    def _cut(self) -> None:
        """Truncate the file being appended to back to its last acknowledged record."""
        hit("wal.undo.truncate", self.path)
        os.ftruncate(self._fd, self._end)
        os.fsync(self._fd)
        self._partial = None

    def rotate(self) -> int:
        """Continue in a new file; returns the last sequence number of the old ones. Raises
        OSError while a failed append's bytes cannot be cut off: they must stay in the newest
        file, where recovery takes them for a torn tail, not for corruption."""
        with self._lock:
            if self._partial is not None:
                self._cut()
            number = self.number + 1
            path = self.folder / file_name(number)
            hit("wal.rotate.open", path)
            fd, end = _open_log(path)
            try:
                fsutil.fsync_dir(self.folder, "wal.rotate")
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
            os.close(self._fd)
            self._fd, self._end, self.number = fd, end, number
            self._last_in[number] = 0
            return self.last_seq

    def drop_through(self, seq: int) -> None:
        """Delete the files all of whose records are at or below ``seq`` (committed in
        segments); the file being appended to is kept."""
        with self._lock:
            done = [n for n, last in self._last_in.items() if last <= seq and n != self.number]
        for n in sorted(done):
            fsutil.unlink(self.folder / file_name(n), "wal.drop")
            with self._lock:
                self._last_in.pop(n, None)
        if done:
            fsutil.fsync_dir(self.folder, "wal.drop")

    def size_bytes(self) -> int:
        total = 0
        for n in self.numbers():
            try:
                total += (self.folder / file_name(n)).stat().st_size
            except FileNotFoundError:
                continue
        return total

    def close(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            if self._partial is not None:
                try:  # else the next open cuts it as a torn tail (bytes kept in torn/)
                    self._cut()
                except OSError:
                    pass
            os.close(self._fd)
            self._fd = -1


def _open_log(path: Path) -> tuple[int, int]:
    """An unbuffered append-only descriptor of ``path`` and the file's size."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    return fd, os.fstat(fd).st_size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # a regular file short of space answers ENOSPC; never spin
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def _reason(e: OSError) -> str:
    return f"[Errno {e.errno}] {os.strerror(e.errno)}" if e.errno else str(e)
