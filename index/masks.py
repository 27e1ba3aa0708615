"""Caches keyed by the identity of immutable objects (segments, live and allow masks).

Segments never change once sealed, and a snapshot's masks are copy-on-write (a write makes a
new mask, ``online/writes.Buffer._forget``): so anything derived from a (segment, mask) pair
can be kept as long as both objects live. numpy arrays are not hashable, so these caches key
by ``id()`` *and* hold a weak reference that is checked on every hit: an id reused by a new
object after the old one died never returns the old value, and an entry goes away when its
object does (the weakref's callback).

``freeze(mask)`` marks a mask immutable (read-only, and remembered): derived-data caches
(dense bitmaps) only serve masks that are frozen, so an array a caller keeps mutating is never
served a stale bitmap.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np


class IdentityLRU:
    """A bounded LRU map from live objects (by identity) to values; thread-safe.

    ``max_entries`` bounds the count, ``max_bytes`` the sum of ``size(value)``."""

    def __init__(self, max_entries: int, max_bytes: int | None = None, size=None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size = size or (lambda v: 0)
        # reentrant: dropping a value can free an object another entry is keyed by, whose
        # weakref callback then runs in this thread while the lock is held
        self._lock = threading.RLock()
        self._data: "OrderedDict[tuple, tuple]" = OrderedDict()  # key -> (refs, value, bytes)
        self.bytes = 0

    @staticmethod
    def _key(objs: tuple, extra) -> tuple:
        return tuple(None if o is None else id(o) for o in objs) + (extra,)

    def get(self, objs: tuple, extra=None):
        key = self._key(objs, extra)
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            refs, value, _ = hit
            if any((r is None) != (o is None) or (r is not None and r() is not o)
                   for r, o in zip(refs, objs)):
                self._drop(key)  # an id reused by another object
                return None
            self._data.move_to_end(key)
            return value

    def put(self, objs: tuple, value, extra=None) -> None:
        key = self._key(objs, extra)
        nbytes = self._size(value)
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return
        refs = tuple(None if o is None else weakref.ref(o, self._callback(key)) for o in objs)
        with self._lock:
            self._drop(key)
            self._data[key] = (refs, value, nbytes)
            self.bytes += nbytes
            while len(self._data) > self.max_entries or (
                    self.max_bytes is not None and self.bytes > self.max_bytes):
                self._drop(next(iter(self._data)))

    def _callback(self, key):
        me = weakref.ref(self)

        def gone(_ref):
            cache = me()
            if cache is not None:
                with cache._lock:
                    hit = cache._data.get(key)
                    if hit is not None and any(r is _ref for r in hit[0]):
                        cache._drop(key)
        return gone

    def _drop(self, key) -> None:
        hit = self._data.pop(key, None)
        if hit is not None:
            self.bytes -= hit[2]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._data)


class MaskCache:
    """One value per live mask (e.g. a segment's statistics over its live rows), for the
    last few masks: after a write only the segments whose mask changed compute again."""

    def __init__(self, keep: int = 4):
        self._lru = IdentityLRU(keep)

    def get(self, mask: np.ndarray, compute):
        value = self._lru.get((mask,))
        if value is None:
            value = compute()
            self._lru.put((mask,), value)
        return value

    def peek(self, mask: np.ndarray):
        """The value kept for this mask, or None."""
        return self._lru.get((mask,))

    def put(self, mask: np.ndarray, value) -> None:
        self._lru.put((mask,), value)

    def derived(self, mask: np.ndarray, compute) -> np.ndarray:
        """``compute(mask)``, a mask derived from ``mask``, frozen and kept by the mask's
        identity when ``mask`` is frozen; a caller's mutable array is derived afresh, never
        kept (it may change)."""
        if not is_frozen(mask):
            return compute(mask)
        got = self._lru.get((mask,))
        if got is None:
            got = freeze(compute(mask))
            self._lru.put((mask,), got)
        return got


class _IdentitySet:
    """Objects (by identity, held weakly) with a flag; lock-free lookups (one dict get), as
    they are on every query's path. An entry leaves with its object."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def add(self, obj) -> None:
        key = id(obj)
        refs = self._refs

        def gone(ref, key=key):
            if refs.get(key) is ref:
                refs.pop(key, None)
        refs[key] = weakref.ref(obj, gone)

    def __contains__(self, obj) -> bool:
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj

    def __len__(self) -> int:
        return len(self._refs)


_FROZEN = _IdentitySet()
_NOTHING = _IdentitySet()


def freeze(mask: np.ndarray | None) -> np.ndarray | None:
    """Mark a mask immutable: read-only from now on and remembered as frozen (by identity)."""
    if mask is not None and mask not in _FROZEN:
        if mask.flags.writeable and mask.base is None:
            mask.flags.writeable = False
        _FROZEN.add(mask)
    return mask


def is_frozen(mask) -> bool:
    return mask is not None and mask in _FROZEN


def nothing(n_rows: int) -> np.ndarray:
    """A new all-False frozen mask of ``n_rows``, known as empty (``is_nothing``): a
    retrieve stage skips its segment instead of searching it with nothing allowed."""
    mask = freeze(np.zeros(n_rows, bool))
    _NOTHING.add(mask)
    return mask


def is_nothing(mask) -> bool:
    return mask is not None and mask in _NOTHING
