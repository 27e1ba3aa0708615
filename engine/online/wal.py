"""The write-ahead log of online writes: framed, checksummed records, fsynced before ack.

Files ``wal/wal-NNNNNNNN.log`` hold records ``[magic u16][length u32][crc32 u32][payload]``
(payload: UTF-8 JSON). A write is acknowledged only after its record is fsynced. On open,
every file is replayed in order; a torn or corrupt record at the tail of the newest file (a
crash mid-append) is cut off, while damage anywhere else is reported as ``Corrupt``.
Sealing rotates to a new file; files whose records are all in committed segments are deleted.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Iterator

from polyindex.errors import Corrupt
from polyindex.storage.fsutil import fsync_dir

MAGIC = 0x5057  # "PW"
HEADER = struct.Struct("<HII")


def _name(seq: int) -> str:
    return f"wal-{seq:08d}.log"


class WriteAheadLog:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        seqs = self.sequences()
        self.seq = seqs[-1] if seqs else 1
        self._file = open(folder / _name(self.seq), "ab")

    def sequences(self) -> list[int]:
        out = []
        for p in self.folder.glob("wal-*.log"):
            try:
                out.append(int(p.stem.split("-")[1]))
            except ValueError:
                continue
        return sorted(out)

    def append(self, record: dict) -> None:
        """Append one record and fsync it: when this returns, the write is durable."""
        payload = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
        frame = HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            self._file.write(frame)
            self._file.flush()
            os.fsync(self._file.fileno())

    def rotate(self) -> int:
        """Start a new file; returns the last sequence number that belongs to the old ones."""
        with self._lock:
            old = self.seq
            self._file.close()
            self.seq += 1
            self._file = open(self.folder / _name(self.seq), "ab")
            fsync_dir(self.folder)
            return old

    def drop_through(self, seq: int) -> None:
        """Delete the files up to ``seq`` (their records are committed in segments)."""
        for s in self.sequences():
            if s <= seq:
                (self.folder / _name(s)).unlink(missing_ok=True)
        fsync_dir(self.folder)

    def size_bytes(self) -> int:
        return sum((self.folder / _name(s)).stat().st_size for s in self.sequences()
                   if (self.folder / _name(s)).exists())

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def replay(self) -> Iterator[dict]:
        """Every record in order; truncates a torn tail of the newest file."""
        seqs = self.sequences()
        for s in seqs:
            yield from self._read(self.folder / _name(s), last=(s == seqs[-1]))

    def _read(self, path: Path, last: bool) -> Iterator[dict]:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            bad = None
            if len(data) - pos < HEADER.size:
                bad = "truncated record header"
            else:
                magic, length, crc = HEADER.unpack_from(data, pos)
                end = pos + HEADER.size + length
                if magic != MAGIC:
                    bad = "bad record marker"
                elif end > len(data):
                    bad = "truncated record"
                elif zlib.crc32(data[pos + HEADER.size:end]) != crc:
                    bad = "checksum mismatch"
            if bad is not None:
                if not last:
                    raise Corrupt(f"{path}: {bad} at byte {pos} (not at the end of the log)")
                # A crash mid-append: the record was never acknowledged. Cut it off.
                with self._lock:
                    self._file.close()
                    with open(path, "r+b") as f:
                        f.truncate(pos)
                        os.fsync(f.fileno())
                    self._file = open(self.folder / _name(self.seq), "ab")
                return
            try:
                yield json.loads(data[pos + HEADER.size:end])
            except ValueError as e:
                raise Corrupt(f"{path}: record at byte {pos} passed its checksum but is not "
                              f"JSON ({e})") from e
            pos = end
