"""A full disk met by a command: one line (RESOURCE_EXHAUSTED, exit 1), not a traceback.

Storage raises the operating system's ENOSPC/EDQUOT as it comes (from Python or pyarrow);
a command says what it was doing and what of its work was kept.
"""
from __future__ import annotations

from contextlib import contextmanager

from polyindex.errors import disk_full, is_disk_full


@contextmanager
def reported(what: str, kept: str):
    """Turn a full disk inside the block into ``ResourceExhausted`` naming ``what`` and
    ``kept`` (what survives: e.g. the segments committed before)."""
    try:
        yield
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise disk_full(e, what, kept) from e
