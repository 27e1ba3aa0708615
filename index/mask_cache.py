"""Per-segment results that depend on a live mask, remembered by the mask object itself.

Live masks are immutable once published (a change makes a new array), so a segment's
statistics over its live rows can be reused by every later snapshot that carries the same
mask: after a write only the segments whose mask changed are recomputed, not the corpus.
Keyed by identity with a weak reference (an id() alone could be reused by a new array).
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, TypeVar

import numpy as np

T = TypeVar("T")
KEEP = 4  # masks remembered per segment and statistic (the last few snapshots')


class MaskCache:
    def __init__(self):
        self._entries: dict[int, tuple[weakref.ref, object]] = {}
        self._lock = threading.Lock()

    def get(self, mask: np.ndarray, compute: Callable[[], T]) -> T:
        key = id(mask)
        with self._lock:
            got = self._entries.get(key)
            if got is not None and got[0]() is mask:
                return got[1]  # type: ignore[return-value]
        value = compute()
        with self._lock:
            for k in [k for k, (ref, _) in self._entries.items() if ref() is None]:
                del self._entries[k]
            while len(self._entries) >= KEEP:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = (weakref.ref(mask), value)
        return value
