"""Many strings of an Arrow string column at once, as Python strings: their UTF-8 bytes
gathered in numba with a NUL between them, then one ``decode`` and one ``split`` (a top-100's
ids were ~100 slices, ``tobytes`` and ``decode`` calls: 20-40 us of a lexical query)."""
from __future__ import annotations

import numba
import numpy as np

SEP = "\x00"  # never inside a UTF-8 character; an id holding it takes the slow path


@numba.njit(cache=True, nogil=True)
def _gather(offsets, data, rows):
    n = len(rows)
    total = 0
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= len(offsets) - 1:
            return False, np.zeros(0, np.uint8)
        total += offsets[r + 1] - offsets[r]
    out = np.zeros(total + max(n - 1, 0), np.uint8)  # zero: the separators
    at = 0
    for i in range(n):
        r = rows[i]
        a, b = offsets[r], offsets[r + 1]
        out[at:at + b - a] = data[a:b]
        at += b - a + 1
    return True, out


def take(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> list[str] | None:
    """The strings at ``rows``, or None when a row is out of range or a string holds ``SEP``
    (the caller's slow path then says or does what it does)."""
    n = len(rows)
    if not n:
        return []
    ok, buf = _gather(offsets, data, rows)
    if not ok:
        return None
    out = buf.tobytes().decode("utf-8").split(SEP)
    return out if len(out) == n else None
