"""``polyindex verify``'s check of a collection's write-ahead log, reading only.

Every frame of every ``wal-*.log`` file is checked as recovery checks it (``wal.scan``:
markers, lengths, checksums, JSON, sequence numbers in order) but nothing is cut or written.
Damage is a problem naming the file and byte offset; an incomplete last frame of the newest
file is a torn tail (a crash mid-append, never acknowledged; the writer cuts it, keeping its
bytes in ``wal/torn/``, when it next opens the collection), reported but not a problem.
"""
from __future__ import annotations

import re
from pathlib import Path

from polyindex.errors import Corrupt
from polyindex.online.wal import scan


def check_wal(folder: Path, after: int) -> tuple[list[dict], list[tuple[Path, str]]]:
    """(one entry per log file: file, size, unsealed_records, torn_tail_at; problems as (file, why))
    for the log in ``folder``; ``after``: the manifest's ``wal_through``."""
    entries: list[dict] = []
    problems: list[tuple[Path, str]] = []
    # the files as named (a hand-made ``wal-1.log`` too), in the log's order
    paths = sorted(((int(m.group(1)), p) for p in (folder.glob("wal-*.log")
                                                    if folder.is_dir() else ())
                    if (m := re.fullmatch(r"wal-(\d+)\.log", p.name))))
    last_seq = after
    for i, (_, path) in enumerate(paths):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # a writer beside us dropped a sealed file
            continue
        entry = {"file": str(path), "size": len(data), "unsealed_records": None,
                 "torn_tail_at": None}
        entries.append(entry)
        try:
            got = scan(path, data, i == len(paths) - 1, last_seq, after)
        except Corrupt as e:
            problems.append((path, str(e)))
            continue
        last_seq = got.last_seq
        entry["unsealed_records"] = len(got.records)  # above wal_through
        entry["torn_tail_at"] = got.torn_at
    return entries, problems
