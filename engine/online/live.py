"""A table's live side, composed over the storage table: the online writer (WAL, write buffer,
sealer) and its background merger, or a read-only reader's follower of the writer's WAL.
``Collection`` holds one; what queries see is its ``snapshot()``."""
from __future__ import annotations

from polyindex.errors import FailedPrecondition
from polyindex.storage.snapshot import Snapshot
from polyindex.storage.table import has_wal


class Live:
    def __init__(self, table, online: bool = False, follow_wal: bool = False):
        """``follow_wal``: a reader's view includes the writer's acknowledged, not yet
        sealed writes (its WAL tail)."""
        self.table = table
        self.writes = None    # ``online.writes.OnlineWrites`` of an online writer
        self.merger = None    # the ``online.merging.BackgroundMerger`` of a writer, online or
        #                       embedded (None: a reader, or merging off)
        self.follow_wal = table.readonly and follow_wal
        self.follower = None  # ``online.follow.WalFollower``, made on first use
        if online:
            from polyindex.online.merging import BackgroundMerger
            from polyindex.online.writes import OnlineWrites
            self.writes = OnlineWrites(table)
            self.merger = BackgroundMerger.start_for(table, self.writes)
        elif not table.readonly:
            if has_wal(table.folder):
                # Acknowledged online writes not yet sealed (the server stopped before
                # sealing): an offline writer seals them first, so nothing acknowledged is
                # left unseen.
                from polyindex.online.writes import OnlineWrites
                OnlineWrites(table).close()
            # An embedded writer merges like the server: its commits wake the merger.
            from polyindex.online.merging import BackgroundMerger
            self.merger = BackgroundMerger.start_for(table, None)

    def snapshot(self) -> Snapshot:
        """The newest committed snapshot, plus, in online mode, the acknowledged writes not
        yet sealed (a follower: the writer's)."""
        online = self.writes
        if online is not None:
            return online.snapshot()
        if self.follow_wal:
            return self._follow().snapshot()
        return self.table.snapshot()

    def _follow(self):
        follower = self.follower
        if follower is None:
            from polyindex.online.follow import WalFollower
            with self.table._lock:
                if self.follower is None:
                    self.follower = WalFollower(self.table)
                follower = self.follower
        return follower

    def delete(self, ids) -> int:
        """Delete documents by id: through the online writer's WAL, or committed directly."""
        online = self.writes  # read once: a concurrent drop sets it to None
        if online is not None:
            return online.delete(ids)
        with self.table.writer() as w:
            n = w.delete(ids)
        self.table.refresh()
        self.wrote()
        return n

    def delete_matching(self, select) -> int:
        """Delete the ids ``select(snapshot)`` names (delete by filter), chosen under the
        writer's lock so no write lands between choosing and deleting."""
        if (online := self.writes) is not None:
            return online.delete_matching(select)
        with self.table.writer() as w:
            self.table.refresh()
            n = w.delete(select(self.table.sealed_snapshot()))
        self.table.refresh()
        self.wrote()
        return n
    def backup(self, path, *, link: bool = False, progress=None) -> dict:
        """Write a snapshot of the collection to ``path`` (``storage.backup``): every write
        acknowledged before the call is in it; its manifest is pinned before this returns."""
        from polyindex.storage.backup import create
        first = [self.sealed_through_now()]
        return create(self.table.folder, path,
                      lambda: first.pop() if first else self.table.sealed_snapshot(),
                      link=link, progress=progress)

    def sealed_through_now(self) -> Snapshot:
        """A committed snapshot holding every write acknowledged before this call (online: the
        buffer sealed first), for ``Collection.snapshot(path)``."""
        if self.table.readonly:
            raise FailedPrecondition(
                f"collection {self.table.name!r} is open read-only: a snapshot must hold the "
                "writer's acknowledged writes, so take it through the writer (`polyindex "
                "snapshot create --server HOST:PORT`, or stop the server and use --data)")
        online = self.writes
        return online.sealed_through_now() if online is not None else \
            self.table.sealed_snapshot()

    def catch_up(self) -> None:
        """A reader: take in the writer's acknowledged writes now (not at the next check)."""
        if self.follow_wal and not self.table.closed:
            self._follow().catch_up(force=True)

    def pending(self) -> dict:
        """``info``'s live part: merges this process made (a server's background merging,
        compact), the buffered writes, a follower's position."""
        st = self.table.merge_stats
        return {**(st if self.merger is not None or st["merges"] else {}),
                **(online.pending() if (online := self.writes) is not None else {}),
                **(f.pending() if (f := self.follower) is not None else {})}

    def wrote(self) -> None:
        """An embedded writer committed: the merger plans now (and counts quiet from now)."""
        merger = self.merger
        if merger is not None and self.writes is None:
            merger.wake()

    def seal(self) -> None:
        """Online mode: seal the buffered writes into a segment now."""
        online = self.writes
        if online is not None:
            online.seal()

    def close(self) -> None:
        """In online mode, seal what is buffered first; then release."""
        online = self.writes
        self._stop_merger()
        try:
            if online is not None:
                online.close()  # seals first: the collection is still open for that
        finally:
            self.writes = None
            self.table.closed = True
            self.table.dir_lock = None  # this handle no longer keeps the directory's lock alive
            self._release()

    def abandon(self) -> None:
        """Close without sealing (the collection is being dropped): stops the sealer, waits
        for an in-flight seal, closes the WAL."""
        self._stop_merger()
        online, self.writes = self.writes, None
        self.table.closed = True
        self.table.dir_lock = None
        if online is not None:
            online.abandon()
        self._release()

    def _release(self) -> None:
        """Let go of opened segments: a closed handle pins no file against collection."""
        with self.table._lock:
            self.table.release()
            follower, self.follower = self.follower, None
        if follower is not None:
            follower.close()  # its private folder of buffer segments

    def _stop_merger(self) -> None:
        merger, self.merger = self.merger, None
        if merger is not None:
            merger.stop()  # an unfinished merge is abandoned: nothing of it committed
