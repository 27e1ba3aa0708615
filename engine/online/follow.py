"""A read-only follower's view of a collection: the sealed manifest plus the writer's WAL tail.

A follower (``polyindex.open(path, readonly=True)``, the read-only workers of ``polyindex
serve --processes N``) reads the WAL records above the manifest's ``wal_through`` into its
own in-memory buffer (``online.view``: the same buffer segments and masks the writer
composes), so a write the writer acknowledged is visible here without waiting for a seal.

Nothing here writes the data directory: files are only opened for reading, buffer segments
are built in a private temporary folder, and damage is never cut or rewritten. An incomplete
or unreadable frame at the end of the newest file is a write in progress (or a torn tail the
writer cuts when it restarts): it is read again later. Anything the writer's recovery calls
corruption (a bad frame followed by a valid one, damage in an older file, a sequence number
out of order, a record that is not JSON) is ``Corrupt`` (DATA_LOSS) naming the file, for
every query until the collection is reopened.

Consistency: the log is read first, the manifest after. A WAL file is deleted only once a
committed manifest covers its records, so the manifest read after the log covers every record
of a file that vanished before it was read; the view is that manifest plus the records above
its ``wal_through``, and a gap in the sequence numbers (which this order rules out) is never
published. Catching up is rate-limited to once per ``RECHECK_S`` and done by the first query
after that: a write acknowledged at time t is in every snapshot taken after t + RECHECK_S.

An I/O error reading the log or the manifest fails that query and changes nothing: the tail
keeps its position and records read before the error are kept for the next catch-up
(failpoints ``follow.wal.*``, ``follow.manifest.read``, ``follow.segment.open``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path

from polyindex.errors import Corrupt, NotFound
from polyindex.online.view import Buffer, BufferedView, remove_segments
from polyindex.online.wal import file_name, file_numbers, frame_at, valid_after
from polyindex.storage.failpoints import hit
from polyindex.storage.snapshot import Snapshot

RECHECK_S = 0.05  # how stale a follower may be about the writer's acknowledged writes
log = logging.getLogger("polyindex.online")


class Rewound(Exception):
    """The file being read is shorter than what was read of it: the writer removed an
    append whose fsync failed (never acknowledged); the follower reads the log again."""


class WalTail:
    """Reads the records appended to a WAL folder since the last call, never writing."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.number: int | None = None  # the file being read, and how far
        self.offset = 0
        self.last_seq = 0
        self.error: str | None = None
        self._watched: tuple[int | None, str] = (None, "")  # (number, its path as a str)

    def grew(self) -> bool:
        """Has the file being read changed size (or gone)? A new file, after a seal's
        rotation, is found by ``read``'s listing instead. Called by every query: one stat, on
        a path made once per file (a pathlib join cost as much as the stat)."""
        number = self.number
        if number is None:
            return False
        if self._watched[0] != number:
            self._watched = (number, os.path.join(self.folder, file_name(number)))
        try:
            return os.stat(self._watched[1]).st_size != self.offset
        except FileNotFoundError:
            return True

    def read(self) -> list[tuple[int, dict]]:
        """The records appended since the last call. An I/O error leaves the position where
        it was (the records of files read before it are read again next time, not lost)."""
        if self.error is not None:
            raise Corrupt(self.error)
        position = self.number, self.offset, self.last_seq
        try:
            return self._read()
        except OSError:
            self.number, self.offset, self.last_seq = position
            raise

    def _read(self) -> list[tuple[int, dict]]:
        hit("follow.wal.list", self.folder)
        numbers = file_numbers(self.folder) if self.folder.is_dir() else []
        out: list[tuple[int, dict]] = []
        for n in numbers:
            if self.number is not None and n < self.number:
                continue
            if n != self.number:
                self.number, self.offset = n, 0
            path = self.folder / file_name(n)
            try:
                hit("follow.wal.open", path)
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < self.offset:
                        raise Rewound(path)
                    f.seek(self.offset)
                    hit("follow.wal.read", path)
                    data = f.read()
            except FileNotFoundError:  # sealed and removed meanwhile: the manifest covers it
                continue
            self._parse(path, data, newest=(n == numbers[-1]), out=out)
        return out

    def _parse(self, path: Path, data: bytes, newest: bool, out: list) -> None:
        pos = 0
        while pos < len(data):
            got = frame_at(data, pos, self.last_seq)
            if isinstance(got, str):
                later = valid_after(data, pos)
                if newest and later is None:
                    break  # a write in progress, or a torn tail: read again later
                where = (f"; a valid record follows at byte {self.offset + later}"
                         if later is not None else " (not the newest log file)")
                self._fail(f"{path}: {got} at byte {self.offset + pos}{where}")
            end, seq, payload = got
            if seq <= self.last_seq:
                self._fail(f"{path}: record at byte {self.offset + pos} has sequence number "
                           f"{seq}, not above the previous {self.last_seq}")
            try:
                record = json.loads(payload)
            except ValueError as e:
                self._fail(f"{path}: record at byte {self.offset + pos} passed its checksum "
                           f"but is not JSON ({e})")
            out.append((seq, record))
            self.last_seq = seq
            pos = end
        self.offset += pos

    def _fail(self, message: str):
        self.error = message
        log.error("WAL tail: %s", message)
        raise Corrupt(message)


class WalFollower(BufferedView):
    """The sealed manifest composed with the WAL records above its ``wal_through``."""

    def __init__(self, table):
        # Buffer segments go to a private folder, never the data directory; removed at close,
        # or at exit for a handle nobody closed (a serve worker's is in its group's folder)
        scratch = Path(tempfile.mkdtemp(prefix="polyindex-follow-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, scratch, True)
        super().__init__(table, scratch)
        self.tail = WalTail(table.folder / "wal")
        self.records: list[tuple[int, dict]] = []  # read and above base's wal_through
        self._unapplied: list[tuple[int, dict]] = []  # read; a failed catch-up kept them
        self.closed = False
        self._catch_lock = threading.Lock()
        self._checked = 0.0
        self._reset = False
        self.catch_up(force=True)

    def snapshot(self) -> Snapshot:
        if self.closed:
            raise NotFound(f"collection {self.table.name!r} was dropped or closed")
        if time.monotonic() - self._checked >= RECHECK_S:
            self.catch_up()
        elif self.tail.grew():  # one stat: a write just acknowledged shows at once
            self.catch_up(force=True)
        return self.view

    def catch_up(self, force: bool = False) -> None:
        """Read what the writer appended and committed since the last call; publish it."""
        with self._catch_lock:
            started = time.monotonic()
            if not force and self._checked and started - self._checked < RECHECK_S:
                return  # another query caught up while this one waited for the lock
            try:
                # the log first, then the manifest (see the module doc)
                new = self._unapplied + self.tail.read()
            except Rewound as e:
                log.warning("%s: %s was cut back by the writer; reading the log again",
                            self.table.name, e)
                self.tail, self.records, self._reset = WalTail(self.tail.folder), [], True
                self._unapplied = []
                new = self.tail.read()
            # Read but not yet published: kept if the manifest cannot be read now (an I/O
            # error), else the tail, already past them, would leave a hole in the view.
            self._unapplied = new
            base = self.table.sealed_snapshot()
            through = base.manifest.wal_through
            self._unapplied = []
            with self.lock:
                records = [r for r in self.records + new if r[0] > through]
                if records and records[0][0] != through + 1:
                    # Not possible in the order above; never publish a view with a hole.
                    log.warning("%s: WAL tail starts at %d above the manifest's %d; retrying",
                                self.table.name, records[0][0], through)
                    self.records = records
                    return
                if base is not self.base or self._reset:  # sealed, or re-read: compose anew
                    self._reset = False
                    old = self.active
                    self.base, self.active, self.records = base, Buffer(), []
                    self._rehide_all()
                    self._publish()
                    new = records
                    remove_segments(old.segments)
                else:
                    new = [r for r in new if r[0] > through]
                if new:
                    self.active.through = new[-1][0]
                    self.apply_records(new)
                self.records = records
            self._checked = started  # a write acknowledged before `started` is now visible

    def pending(self) -> dict:
        return {"buffered_docs": len(self.active.docs),
                "buffered_deletes": len(self.active.deleted),
                "wal_seq": max(self.active.through, self.base.manifest.wal_through)}

    def close(self) -> None:
        self.indexer.stop()  # before the locks: its last publish takes the view's lock
        with self._catch_lock, self.lock:
            self.closed = True
            self._cleanup()

