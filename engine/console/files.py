"""The evaluation files the console may read: under one root (the data directory or
``serve --console-root``), never beyond it. A name is resolved (``..`` and symlinks followed)
and refused unless it stays under the resolved root."""
from __future__ import annotations

import os
from pathlib import Path

from polyindex.errors import InvalidArgument

SUFFIXES = (".jsonl", ".tsv", ".txt", ".trec", ".qrels", ".xml", ".gz")
SKIP = {"segments", "wal", "artifacts", "tombstones", "__pycache__"}  # collections' insides
MAX_DEPTH = 4
MAX_FILES = 500


class Files:
    def __init__(self, root):
        self.root = Path(root).resolve()

    def resolve(self, name: str, what: str) -> Path:
        """``name`` (relative to the root) as a path under the root; InvalidArgument naming
        ``what`` and ``name`` (never the server's path) otherwise."""
        if not name or "\x00" in name:
            raise InvalidArgument(f"{what}: give a file under the console's root")
        path = (self.root / name).resolve()
        if path != self.root and self.root not in path.parents:
            raise InvalidArgument(f"{what} {name!r} is outside the console's root")
        if not path.exists():
            raise InvalidArgument(f"{what} {name!r}: no such file under the console's root")
        return path

    def listing(self) -> list[str]:
        """Files under the root that may hold queries or qrels (relative names), at most
        MAX_FILES, at most MAX_DEPTH folders down; symlinks are not followed out."""
        out: list[str] = []
        for top, dirs, names in os.walk(self.root):
            rel = Path(top).relative_to(self.root)
            dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.startswith(".")
                             and len(rel.parts) < MAX_DEPTH)
            for n in sorted(names):
                if n.endswith(SUFFIXES) and not n.startswith("."):
                    p = Path(top) / n
                    if self.root in p.resolve().parents:
                        out.append(str(rel / n) if rel.parts else n)
                        if len(out) >= MAX_FILES:
                            return out
        return out
